package leasehold

import (
	"context"
	"sync"
)

// gate is the local keyed mutex: goroutines of one process contend here
// first, so a locker has at most one store request in flight and one lease
// per key. Waiters get the key in the order they arrived (FIFO): unlock hands
// it to the oldest waiter directly, so a newcomer cannot overtake it.
type gate struct {
	mu sync.Mutex
	m  map[string]*gateEntry
}

// gateEntry is one key's gate: taken, and the queue of waiters.
type gateEntry struct {
	key   string
	taken bool
	queue []*gateWaiter
}

// gateWaiter is one goroutine waiting in lock. granted is set (and ch
// closed) when unlock handed it the key.
type gateWaiter struct {
	ch      chan struct{}
	granted bool
}

// tryLock takes key's gate without waiting.
func (g *gate) tryLock(key string) (*gateEntry, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entry(key)
	if e.taken {
		return nil, false
	}
	e.taken = true
	return e, true
}

// entry returns key's entry, creating it. g.mu held.
func (g *gate) entry(key string) *gateEntry {
	if g.m == nil {
		g.m = make(map[string]*gateEntry)
	}
	e := g.m[key]
	if e == nil {
		e = &gateEntry{key: key}
		g.m[key] = e
	}
	return e
}

// lock takes key's gate, waiting in FIFO order until ctx ends (its error) or
// closing is closed (ErrLockerClosed).
func (g *gate) lock(ctx context.Context, key string, closing <-chan struct{}) (*gateEntry, error) {
	g.mu.Lock()
	e := g.entry(key)
	if !e.taken {
		e.taken = true
		g.mu.Unlock()
		return e, nil
	}
	w := &gateWaiter{ch: make(chan struct{})}
	e.queue = append(e.queue, w)
	g.mu.Unlock()

	var err error
	select {
	case <-w.ch:
		return e, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-closing:
		err = ErrLockerClosed
	}
	g.mu.Lock()
	if w.granted { // handed over while we gave up: pass it on
		g.mu.Unlock()
		g.unlock(e)
		return nil, err
	}
	for i, q := range e.queue {
		if q == w {
			e.queue = append(e.queue[:i], e.queue[i+1:]...)
			break
		}
	}
	g.mu.Unlock()
	return nil, err
}

// unlock frees a gate taken by tryLock or lock, handing it to the oldest
// waiter if there is one. Call it exactly once per lock.
func (g *gate) unlock(e *gateEntry) {
	if e == nil { // a semaphore's permit takes no gate
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(e.queue) > 0 {
		w := e.queue[0]
		e.queue[0] = nil
		e.queue = e.queue[1:]
		w.granted = true
		close(w.ch)
		return
	}
	e.taken = false
	delete(g.m, e.key)
}
