package leasehold

import (
	"context"
	"sync"
)

// gate is the local keyed mutex: goroutines of one process contend here
// first, so a locker has at most one store request in flight and one lease
// per key.
type gate struct {
	mu   sync.Mutex
	m    map[string]*gateEntry
	pool sync.Pool // of *gateEntry with an empty sem
}

type gateEntry struct {
	key  string
	sem  chan struct{} // capacity 1: a token in it means taken
	refs int           // holders plus waiters; the entry goes away at zero
}

func (g *gate) ref(key string) *gateEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = make(map[string]*gateEntry)
	}
	e := g.m[key]
	if e == nil {
		if pe, ok := g.pool.Get().(*gateEntry); ok {
			e = pe
		} else {
			e = &gateEntry{sem: make(chan struct{}, 1)}
		}
		e.key = key
		g.m[key] = e
	}
	e.refs++
	return e
}

func (g *gate) unref(e *gateEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(g.m, e.key)
		e.key = ""
		g.pool.Put(e) // nobody else can reach it: its sem is empty
	}
}

// tryLock takes key's gate without waiting.
func (g *gate) tryLock(key string) (*gateEntry, bool) {
	e := g.ref(key)
	select {
	case e.sem <- struct{}{}:
		return e, true
	default:
		g.unref(e)
		return nil, false
	}
}

// lock takes key's gate, waiting until ctx ends (its error) or closing is
// closed (ErrLockerClosed).
func (g *gate) lock(ctx context.Context, key string, closing <-chan struct{}) (*gateEntry, error) {
	e := g.ref(key)
	select {
	case e.sem <- struct{}{}:
		return e, nil
	case <-ctx.Done():
		g.unref(e)
		return nil, ctx.Err()
	case <-closing:
		g.unref(e)
		return nil, ErrLockerClosed
	}
}

// unlock frees a gate taken by tryLock or lock. Call it exactly once.
func (g *gate) unlock(e *gateEntry) {
	<-e.sem
	g.unref(e)
}
