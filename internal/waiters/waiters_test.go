package waiters

import (
	"sync"
	"testing"
	"time"
)

func received(ch <-chan struct{}) bool {
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
