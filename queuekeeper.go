package leasehold

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// keeper keeps the queue places of a Locker's waiting lock acquires with one
// driver.QueueRefresher call per refresh interval, however many wait, instead
// of an Acquire each. Its goroutine runs while a place is registered; the
// last place to leave stops it, and Close joins it.
//
// A place is refreshed at every round whose next round would come after its
// refresh is due (its last Acquire or refresh + the interval), so no place
// waits longer than one interval. Any answer but "still queued, key held"
// (not queued, key free, a store error) wakes its acquire, which then sends
// a full Acquire: that one re-queues, takes the key, or reports the failure.
//
// Over a driver.PresenceKeeper, every round also keeps the Store's presence
// (one request), and places are queued and refreshed with Kept: they live
// keptFactor × WaiterTTL while the presence lasts. A place next in line
// behind a holder, which times the holder's expiry itself, is then
// refreshed only every third of that; the others still every round, since
// the refresh also tells them when the key went free.
type keeper struct {
	rq      driver.QueueRefresher
	every   time.Duration // the refresh interval
	ttl     time.Duration // WaiterTTL
	kept    time.Duration // how long a place kept by the presence lives
	timeout time.Duration // of one RefreshQueue call

	mu      sync.Mutex
	pk      driver.PresenceKeeper // nil: no presence (the store has none)
	present time.Time             // when the last KeepPresence that succeeded was sent
	places  map[*place]struct{}
	running bool
	kick    chan struct{} // capacity 1: the last place left
	wg      sync.WaitGroup
	ctx     context.Context // the Locker's: ended by Close
}

// keptFactor is how many WaiterTTLs a place kept by the presence lives: it
// bounds how long a place its process forgot (an acquire applied after its
// clean-up release) stays queued while the process lives.
const keptFactor = 20

// place is one waiting acquire's place in its key's queue. Its fields but
// key, token and stale are guarded by keeper.mu.
type place struct {
	key, token string
	stale      chan struct{} // capacity 1: send an Acquire
	due        time.Time     // when the place needs a refresh
	wrote      time.Time     // when the last acquire or refresh that kept it was sent
	kept       bool          // that write was kept by the presence
	present    time.Time     // keeper.present when that write was sent
	head       bool          // next in line behind a holder, at the last acquire
}

// newKeeper returns the Locker's keeper, or nil when the store cannot
// refresh queue places.
func newKeeper(l *Locker) *keeper {
	rq, ok := l.store.(driver.QueueRefresher)
	if !ok {
		return nil
	}
	o := &l.opts
	every := min(o.WaiterTTL/3, o.WaitCap)
	pk, _ := rq.(driver.PresenceKeeper)
	// A refresh may take up to an interval: a place lasts WaiterTTL (three).
	return &keeper{rq: rq, pk: pk, every: every, ttl: o.WaiterTTL, kept: keptFactor * o.WaiterTTL, timeout: every,
		places: make(map[*place]struct{}), kick: make(chan struct{}, 1), ctx: l.ctx}
}

// keptFor returns the Kept of a request for a registered place, the kept
// lifetime once the presence was kept (else 0), and when the presence was
// last kept: a keeping whose answer came before the request was sent,
// hence applied before any hand-off that the request's place received.
func (k *keeper) keptFor() (time.Duration, time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pk == nil || k.present.IsZero() {
		return 0, time.Time{}
	}
	return k.kept, k.present
}

// wrote records a write sent at sent that kept p (kept: by the presence,
// last kept at present), and when p next needs a refresh. Guarded by k.mu.
func (k *keeper) wrote(p *place, sent time.Time, kept bool, present time.Time) {
	if sent.Before(p.wrote) {
		return
	}
	p.wrote, p.kept, p.present = sent, kept, present
	p.due = sent.Add(k.every)
	if kept && p.head {
		p.due = sent.Add(k.kept / 3)
	}
}

// join registers the place of token, queued by an Acquire sent at sent
// (kept: with Kept, the presence last kept at present; head: next in line
// behind a holder).
func (k *keeper) join(key, token string, sent time.Time, kept bool, present time.Time, head bool) *place {
	p := &place{key: key, token: token, stale: make(chan struct{}, 1), head: head}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.wrote(p, sent, kept, present)
	k.places[p] = struct{}{}
	if !k.running {
		k.running = true
		k.wg.Add(1)
		go k.loop()
	}
	return p
}

// requeued records a full Acquire sent at sent that kept p's place.
func (k *keeper) requeued(p *place, sent time.Time, kept bool, present time.Time, head bool) {
	k.mu.Lock()
	p.head = head
	k.wrote(p, sent, kept, present)
	k.mu.Unlock()
}

// keptSince returns the instant from which p's place is known to last
// WaiterTTL: the send of the last write that kept it, or for a place kept
// by the presence the earlier of the presence's last keeping before that
// write and the place's own end less WaiterTTL. A keeping since then may
// have come after a hand-off, which it did not extend.
func (k *keeper) keptSince(p *place) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p.kept {
		return earliest(p.present, p.wrote.Add(k.kept-k.ttl))
	}
	return p.wrote
}

// leave unregisters p.
func (k *keeper) leave(p *place) {
	k.mu.Lock()
	delete(k.places, p)
	last := len(k.places) == 0
	k.mu.Unlock()
	if last {
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}
}

// wait joins the goroutine (Close, once every waiting acquire returned).
func (k *keeper) wait() { k.wg.Wait() }

func (k *keeper) loop() {
	defer k.wg.Done()
	t := time.NewTimer(k.every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-k.kick:
		case <-k.ctx.Done():
			k.stop()
			return
		}
		batch, ok := k.due(time.Now())
		if !ok {
			return
		}
		k.keepPresence()
		if len(batch) > 0 {
			k.refresh(batch)
		}
		t.Reset(k.every)
	}
}

// stop marks the goroutine stopped.
func (k *keeper) stop() {
	k.mu.Lock()
	k.running = false
	k.mu.Unlock()
}

// due returns the places to refresh now: those due before the next round.
// It reports false, and marks the goroutine stopped, when no place is left.
func (k *keeper) due(now time.Time) ([]*place, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.places) == 0 {
		k.running = false
		return nil, false
	}
	next := now.Add(k.every)
	var batch []*place
	for p := range k.places {
		if p.due.Before(next) {
			batch = append(batch, p)
		}
	}
	return batch, true
}

// keepPresence keeps the Store's presence, when it has one, for WaiterTTL.
func (k *keeper) keepPresence() {
	k.mu.Lock()
	pk := k.pk
	k.mu.Unlock()
	if pk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(k.ctx, k.timeout)
	sent := time.Now()
	err := pk.KeepPresence(ctx, k.ttl)
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case err == nil:
		k.present = sent
	case errors.Is(err, errors.ErrUnsupported):
		k.pk = nil
	default:
		// The presence may lapse: every kept place is refreshed next
		// round (a refresh that finds it gone wakes its acquire), until a
		// keeping succeeds again.
		for p := range k.places {
			if p.kept {
				p.due = sent
			}
		}
	}
}

// refresh sends one RefreshQueue for batch and wakes the acquire of every
// place it did not keep with the key held.
func (k *keeper) refresh(batch []*place) {
	kept, present := k.keptFor()
	reqs := make([]driver.QueueRefresh, len(batch))
	for i, p := range batch {
		reqs[i] = driver.QueueRefresh{Key: p.key, Token: p.token, QueueTTL: k.ttl, Kept: kept}
	}
	ctx, cancel := context.WithTimeout(k.ctx, k.timeout)
	sent := time.Now()
	errs := k.rq.RefreshQueue(ctx, reqs)
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, p := range batch {
		if len(errs) == len(batch) && errs[i] == nil {
			k.wrote(p, sent, kept > 0, present)
			continue
		}
		select {
		case p.stale <- struct{}{}:
		default:
		}
	}
}
