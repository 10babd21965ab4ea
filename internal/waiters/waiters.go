// Package waiters is the keyed fan-out behind the stores' release
// notifications: waiters register per key, and a release (or a lost
// notification stream) wakes them. It is safe for concurrent use; the zero
// Set is ready.
package waiters

import "sync"

// Set holds the waiters of every key.
type Set struct {
	mu sync.Mutex
	m  map[string]map[chan struct{}]struct{}
}

// Add registers a waiter for key. The channel receives a value (it is never
// closed) on every Wake of key while registered; stop unregisters it and is
// safe to call more than once.
func (s *Set) Add(key string) (ch <-chan struct{}, stop func()) {
	c := make(chan struct{}, 1)
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[string]map[chan struct{}]struct{})
	}
	byKey := s.m[key]
	if byKey == nil {
		byKey = make(map[chan struct{}]struct{})
		s.m[key] = byKey
	}
	byKey[c] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	return c, func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.m[key], c)
			if len(s.m[key]) == 0 {
				delete(s.m, key)
			}
			s.mu.Unlock()
		})
	}
}

// Wake tells key's waiters that it was released, without blocking: a waiter
// that has not consumed its previous wake-up gets only one.
func (s *Set) Wake(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m[key] {
		poke(c)
	}
}

// WakeAll wakes every waiter of every key, e.g. after notifications may have
// been missed.
func (s *Set) WakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byKey := range s.m {
		for c := range byKey {
			poke(c)
		}
	}
}

// Len returns the number of registered waiters.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, byKey := range s.m {
		n += len(byKey)
	}
	return n
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
