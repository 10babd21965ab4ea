package leasehold

import (
	"testing"
	"time"
)

// A head waiter told "held, 0 left" (the last millisecond of a Redis PTTL)
// retries within a millisecond, not 25 ms later, then backs off doubling.
func TestNextTryRetriesTheLastMillisecondAtOnce(t *testing.T) {
	l := &Locker{opts: Options{WaiterTTL: DefaultWaiterTTL, WaitCap: DefaultWaitCap}}
	a := &attempt{l: l, backoff: firstBackoff}
	now := time.Now()
	if d := a.nextTry(Grant{Ahead: 0, Remaining: 0}, now).Sub(now); d > 2*time.Millisecond {
		t.Fatalf("expected the first retry within 2ms, got %v", d)
	}
	if a.backoff != 2*time.Millisecond {
		t.Fatalf("expected the back-off to double to 2ms, got %v", a.backoff)
	}
	if d := a.nextTry(Grant{Ahead: 0, Remaining: 40 * time.Millisecond}, now).Sub(now); d < 39*time.Millisecond || d > 41*time.Millisecond {
		t.Fatalf("expected the next try at the holder's exact remaining 40ms, got %v", d)
	}
}
