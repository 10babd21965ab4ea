package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// The idle tracker reports a key left free longer than its bound while a
// goroutine waited, and nothing for a short gap or for an exempt key.
func TestIdleTracker(t *testing.T) {
	tr := newIdleTracker(50 * time.Millisecond)
	tr.change("short", 0, 1) // free with a waiter
	tr.change("short", 1, -1)
	tr.change("long", 1, 0) // held
	tr.change("long", 0, 1)
	tr.change("long", -1, 0) // free with a waiter from now
	tr.change("exempt", 0, 1)
	tr.Observe(leasehold.Event{Kind: leasehold.EventAbandoned, Key: "exempt"})
	time.Sleep(100 * time.Millisecond)
	tr.change("long", 1, -1)
	tr.change("exempt", 1, -1)
	got := tr.violations()
	if len(got) != 1 || !strings.Contains(got[0], `"long" was free for`) {
		t.Fatalf("expected one violation, for \"long\", got %q", got)
	}
}
