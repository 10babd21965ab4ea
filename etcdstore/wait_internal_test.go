package etcdstore

import (
	"context"
	"testing"
	"time"
)

// waitUntil returns at its deadline, not before, and gives up when its
// context ends first.
func TestWaitUntil(t *testing.T) {
	for _, d := range []time.Duration{0, 300 * time.Microsecond, 3 * time.Millisecond} {
		at := time.Now().Add(d)
		if !waitUntil(context.Background(), at) || time.Now().Before(at) {
			t.Fatalf("waitUntil(%v): returned false or before the deadline", d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if waitUntil(ctx, time.Now().Add(time.Hour)) {
		t.Fatal("waitUntil: expected false when the context ends first")
	}
}
