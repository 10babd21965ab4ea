package waiters

import (
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
)

func received(ch <-chan driver.Wake) bool {
	select {
	case <-ch:
		return true
	case <-time.After(10 * time.Millisecond):
		return false
	}
}

func TestWakeReachesOnlyThatKeysWaiters(t *testing.T) {
	var s Set
	a1, stopA1 := s.Add("a")
	a2, stopA2 := s.Add("a")
	b, stopB := s.Add("b")
	defer stopB()
	s.Wake("a")
	if !received(a1) || !received(a2) {
		t.Fatal("expected both waiters of a to wake")
	}
	if received(b) {
		t.Fatal("expected b's waiter to stay asleep on a's release")
	}
	s.Wake("a")
	s.Wake("a") // the second wake-up is coalesced, never blocks
	if !received(a1) || received(a1) {
		t.Fatal("expected exactly one pending wake-up")
	}
	stopA1()
	stopA1() // idempotent
	stopA2()
	if n := s.Len(); n != 1 {
		t.Fatalf("expected 1 waiter left, got %d", n)
	}
	s.WakeAll()
	if !received(b) {
		t.Fatal("expected WakeAll to wake b")
	}
	stopB()
	if n := s.Len(); n != 0 || len(s.m) != 0 {
		t.Fatalf("expected no waiters and no keys left, got %d waiters, %d keys", n, len(s.m))
	}
}

func TestConcurrentUse(t *testing.T) {
	var s Set
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := string(rune('a' + i%5))
			ch, stop := s.Add(key)
			defer stop()
			s.Wake(key)
			<-ch
		}()
	}
	wg.Wait()
	if n := s.Len(); n != 0 {
		t.Fatalf("expected every waiter gone, got %d", n)
	}
}

func TestWakeTokenReachesOnlyThatToken(t *testing.T) {
	var s Set
	w1, stop1 := s.AddToken("k", "t1", false)
	defer stop1()
	w2, stop2 := s.AddToken("k", "t2", false)
	defer stop2()
	other, stopO := s.AddToken("o", "t1", false)
	defer stopO()
	anon, stopA := s.Add("k")
	defer stopA()
	if !s.WakeToken("k", "t1") {
		t.Fatal("WakeToken(k, t1): expected a registered waiter")
	}
	if !received(w1) {
		t.Fatal("expected t1's waiter of k to wake")
	}
	if received(w2) || received(other) {
		t.Fatal("expected WakeToken(k, t1) to wake t1's waiter of k only, and no other token's")
	}
	if !received(anon) {
		t.Fatal("expected WakeToken(k, t1) to wake k's observer (a waiter with no token) too")
	}
	if s.WakeToken("k", "nobody") {
		t.Fatal("WakeToken of an unregistered token: expected false")
	}
	if !s.Has("k") || s.Has("none") {
		t.Fatal("Has: expected k registered and none not")
	}
	s.Wake("k")
	if !received(w1) || !received(w2) || !received(anon) || received(other) {
		t.Fatal("expected Wake(k) to wake every waiter of k and no other key's")
	}
}
