package etcdstore_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// A key's watch outlives its last subscriber by about watchLinger (2 s), then ends.
func TestIdleKeyWatchEnds(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	key := uniqueKey(t, "k")
	_, stop, err := s.WaitRelease(ctxFor(t, 5*time.Second), key, "w")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !s.Live(key) {
		t.Fatal("expected the key's watch to outlive its last subscriber for a while")
	}
	for deadline := time.Now().Add(10 * time.Second); s.Live(key); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the key's watch still runs 10 s after its last subscriber left")
		}
	}
}
