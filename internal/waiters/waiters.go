// Package waiters is the keyed fan-out behind the stores' release
// notifications: waiters register per key (and, where the store can address
// one waiter, per token), and a release, a queue change or a lost
// notification stream wakes them. It is safe for concurrent use; the zero Set
// is ready.
package waiters

import (
	"sync"

	"github.com/leasehold/leasehold/driver"
)

// Set holds the waiters of every key.
type Set struct {
	mu sync.Mutex
	m  map[string]map[chan driver.Wake]string // key -> channel -> token ("" for Add)
}

// Add registers an observer of key (a waiter with no token): it is woken by
// Wake(key), by WakeToken(key, any token) and by WakeAll. See AddToken.
func (s *Set) Add(key string) (ch <-chan driver.Wake, stop func()) {
	return s.AddToken(key, "", false)
}

// AddToken registers token's waiter for key. The channel receives a value
// (it is never closed) on every Wake of key, every WakeToken of key and
// token, and every WakeAll while registered, and at once when now is true
// (a store that cannot promise it missed nothing since token's last waiting
// Acquire); stop unregisters it and is safe to call more than once.
func (s *Set) AddToken(key, token string, now bool) (ch <-chan driver.Wake, stop func()) {
	c := make(chan driver.Wake, 1)
	if now {
		c <- driver.Wake{}
	}
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[string]map[chan driver.Wake]string)
	}
	byKey := s.m[key]
	if byKey == nil {
		byKey = make(map[chan driver.Wake]string)
		s.m[key] = byKey
	}
	byKey[c] = token
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

// Wake wakes every waiter of key, without blocking: a waiter that has not
// consumed its previous wake-up gets only one.
func (s *Set) Wake(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m[key] {
		poke(c)
	}
}

// WakeToken wakes the waiters that registered key with token, and key's
// observers (registered with no token), without blocking; other tokens'
// waiters stay asleep. It reports whether a waiter of token was registered.
func (s *Set) WakeToken(key, token string) bool {
	return s.Hand(key, token, driver.Wake{})
}

// Hand is WakeToken with w for token's waiters: a hand-off replaces a
// wake-up they have not consumed yet. Observers get a zero Wake.
func (s *Set) Hand(key, token string, w driver.Wake) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := false
	for c, tok := range s.m[key] {
		switch tok {
		case token:
			Send(c, w)
			found = true
		case "": // an observer: woken by every release of key
			poke(c)
		}
	}
	return found
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

// Has reports whether key has a registered waiter.
func (s *Set) Has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m[key]) > 0
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

func poke(c chan driver.Wake) { Send(c, driver.Wake{}) }

// Send puts w on c, a channel of capacity 1, without blocking; a hand-off
// (non-zero w) replaces a plain wake-up already there. The caller holds the
// lock that every sender to c holds, so no other send races it.
func Send(c chan driver.Wake, w driver.Wake) {
	select {
	case c <- w:
		return
	default:
	}
	if w == (driver.Wake{}) {
		return
	}
	select {
	case <-c:
	default:
	}
	select {
	case c <- w:
	default:
	}
}
