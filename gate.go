package leasehold

import (
	"context"
	"sync"
)

// gate is the local keyed mutex: goroutines of one process contend here
// first, so a locker has at most one store request in flight per key and one
// lease per key.
type gate struct {
	mu sync.Mutex
	m  map[string]*gateEntry
}

type gateEntry struct {
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
		e = &gateEntry{sem: make(chan struct{}, 1)}
		g.m[key] = e
	}
	e.refs++
	return e
}

func (g *gate) unref(key string, e *gateEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(g.m, key)
	}
}

// tryLock takes key's gate without waiting.
func (g *gate) tryLock(key string) (unlock func(), ok bool) {
	e := g.ref(key)
	select {
	case e.sem <- struct{}{}:
		return g.unlocker(key, e), true
	default:
		g.unref(key, e)
		return nil, false
	}
}

// lock takes key's gate, waiting until ctx ends.
func (g *gate) lock(ctx context.Context, key string) (unlock func(), err error) {
	e := g.ref(key)
	select {
	case e.sem <- struct{}{}:
		return g.unlocker(key, e), nil
	case <-ctx.Done():
		g.unref(key, e)
		return nil, ctx.Err()
	}
}

func (g *gate) unlocker(key string, e *gateEntry) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			<-e.sem
			g.unref(key, e)
		})
	}
}
