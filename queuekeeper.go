package leasehold

import (
	"context"
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
type keeper struct {
	rq      driver.QueueRefresher
	every   time.Duration // the refresh interval
	ttl     time.Duration // WaiterTTL
	timeout time.Duration // of one RefreshQueue call

	mu      sync.Mutex
	places  map[*place]struct{}
	running bool
	kick    chan struct{} // capacity 1: the last place left
	wg      sync.WaitGroup
	ctx     context.Context // the Locker's: ended by Close
}

// place is one waiting acquire's place in its key's queue.
type place struct {
	key, token string
	stale      chan struct{} // capacity 1: send an Acquire
	due        time.Time     // when the place needs a refresh; guarded by keeper.mu
	kept       time.Time     // when the last successful refresh was sent; guarded by keeper.mu
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
	// A refresh may take up to an interval: a place lasts WaiterTTL (three).
	return &keeper{rq: rq, every: every, ttl: o.WaiterTTL, timeout: every,
		places: make(map[*place]struct{}), kick: make(chan struct{}, 1), ctx: l.ctx}
}

// join registers the place of token, queued by an Acquire sent at sent.
func (k *keeper) join(key, token string, sent time.Time) *place {
	p := &place{key: key, token: token, stale: make(chan struct{}, 1), due: sent.Add(k.every)}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.places[p] = struct{}{}
	if !k.running {
		k.running = true
		k.wg.Add(1)
		go k.loop()
	}
	return p
}

// requeued records a full Acquire sent at sent that kept p's place.
func (k *keeper) requeued(p *place, sent time.Time) {
	k.mu.Lock()
	p.due = sent.Add(k.every)
	k.mu.Unlock()
}

// keptSince returns when the last refresh that kept p's place was sent
// (zero: none).
func (k *keeper) keptSince(p *place) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return p.kept
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

// refresh sends one RefreshQueue for batch and wakes the acquire of every
// place it did not keep with the key held.
func (k *keeper) refresh(batch []*place) {
	reqs := make([]driver.QueueRefresh, len(batch))
	for i, p := range batch {
		reqs[i] = driver.QueueRefresh{Key: p.key, Token: p.token, QueueTTL: k.ttl}
	}
	ctx, cancel := context.WithTimeout(k.ctx, k.timeout)
	sent := time.Now()
	errs := k.rq.RefreshQueue(ctx, reqs)
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, p := range batch {
		if len(errs) == len(batch) && errs[i] == nil {
			p.due, p.kept = sent.Add(k.every), sent
			continue
		}
		select {
		case p.stale <- struct{}{}:
		default:
		}
	}
}
