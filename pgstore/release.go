package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// releaseSlots bounds the release statements a store has in flight, and
// maxReleaseBatch the releases in one: releases that find every slot taken
// wait together and go in one statement when a slot frees. Ten thousand
// releases at once each waiting alone for one of the pool's connections
// (four on two cores) ran out their 2 s timeout after about 2,000 had gone.
const (
	releaseSlots    = 4
	maxReleaseBatch = 256
)

// releaser groups concurrent releases. A release waits for its result, for
// a free slot (it then sends the oldest waiting releases, its own among
// them when it is one of the oldest) or for its context; it spawns no
// goroutine.
type releaser struct {
	slots   chan struct{} // a token per statement in flight
	mu      sync.Mutex
	pending []*pendingRelease // oldest first
}

// pendingRelease is one release and, once done is closed, its outcome.
type pendingRelease struct {
	ctx        context.Context
	key, token string
	sent       bool // taken into a statement (under mu)
	res        int32
	kept       bool
	err        error
	done       chan struct{}
}

func (r *releaser) init() {
	r.slots = make(chan struct{}, releaseSlots)
}

// release releases (key, token) alone or with others: res 0, 1 or 2 as the
// release function returns, kept when the fast release applied.
func (r *releaser) release(ctx context.Context, s *Store, key, token string) (res int32, kept bool, err error) {
	me := &pendingRelease{ctx: ctx, key: key, token: token, done: make(chan struct{})}
	r.mu.Lock()
	r.pending = append(r.pending, me)
	r.mu.Unlock()
	for {
		select {
		case <-me.done:
			return me.res, me.kept, me.err
		case <-ctx.Done():
			r.drop(me) // unless sent: then it may still apply
			return 0, false, ctx.Err()
		case r.slots <- struct{}{}:
			batch := r.take(me)
			if batch != nil {
				s.releaseBatch(batch)
			}
			<-r.slots
			if batch == nil { // another release sent mine
				select {
				case <-me.done:
					return me.res, me.kept, me.err
				case <-ctx.Done():
					return 0, false, ctx.Err()
				}
			}
		}
	}
}

// take returns the oldest pending releases, at most maxReleaseBatch, or
// nil when me was already sent.
func (r *releaser) take(me *pendingRelease) []*pendingRelease {
	r.mu.Lock()
	defer r.mu.Unlock()
	if me.sent {
		return nil
	}
	n := min(len(r.pending), maxReleaseBatch)
	batch := slices.Clone(r.pending[:n])
	r.pending = slices.Delete(r.pending, 0, n)
	for _, p := range batch {
		p.sent = true
	}
	return batch
}

// drop removes me from the pending releases (when it was not sent).
func (r *releaser) drop(me *pendingRelease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = slices.DeleteFunc(r.pending, func(p *pendingRelease) bool { return p == me })
}

// releaseBatch sends batch: one release in its own statement (the fast
// release or the release function), more in one call of releaseBatchSQL,
// on a context that ends at the latest of their deadlines.
func (s *Store) releaseBatch(batch []*pendingRelease) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	if len(batch) == 1 {
		p := batch[0]
		p.err = retry(p.ctx, func() error {
			return s.db.QueryRow(p.ctx, s.releaseSQL, p.key, p.token, s.channel, s.opts.Durable).Scan(&p.res, &p.kept)
		})
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	slices.SortFunc(batch, func(a, b *pendingRelease) int {
		return cmp.Or(strings.Compare(a.key, b.key), strings.Compare(a.token, b.token))
	})
	keys := make([]string, len(batch))
	tokens := make([]string, len(batch))
	for i, p := range batch {
		keys[i], tokens[i] = p.key, p.token
	}
	var res []int32
	err := retry(ctx, func() error {
		return s.db.QueryRow(ctx, s.releaseBatchSQL, keys, tokens, s.channel, s.opts.Durable).Scan(&res)
	})
	if err == nil && len(res) != len(batch) {
		err = fmt.Errorf("pgstore: %d results for %d releases", len(res), len(batch))
	}
	for i, p := range batch {
		if p.err = err; err == nil {
			p.res = res[i]
		}
	}
}

// batchContext returns a context with the first release's values that ends
// at the latest deadline of batch, or never when one has none: a release
// whose own context ends first stops waiting for it.
func batchContext(batch []*pendingRelease) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, p := range batch {
		d, ok := p.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(batch[0].ctx))
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), last)
}
