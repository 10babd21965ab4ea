package leasehold

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// A head waiter told "held, 0 left" (the last millisecond of a Redis PTTL)
// retries within a millisecond, not 25 ms later, then backs off doubling.
func TestNextTryRetriesTheLastMillisecondAtOnce(t *testing.T) {
	l := &Locker{opts: Options{WaiterTTL: DefaultWaiterTTL, WaitCap: DefaultWaitCap}}
	a := &attempt{l: l, backoff: firstBackoff}
	now := time.Now()
	if d := a.nextTry(driver.Grant{Ahead: 0, Remaining: 0}, now).Sub(now); d > 2*time.Millisecond {
		t.Fatalf("expected the first retry within 2ms, got %v", d)
	}
	if a.backoff != 2*time.Millisecond {
		t.Fatalf("expected the back-off to double to 2ms, got %v", a.backoff)
	}
	if d := a.nextTry(driver.Grant{Ahead: 0, Remaining: 40 * time.Millisecond}, now).Sub(now); d < 39*time.Millisecond || d > 41*time.Millisecond {
		t.Fatalf("expected the next try at the holder's exact remaining 40ms, got %v", d)
	}
}

// A head waiter whose holder expires before its queue place needs a refresh
// retries at the expiry, not at the refresh due just before it (with the
// defaults, a 1 s TTL expires when the refresh every WaiterTTL/3 is due).
func TestNextTrySkipsTheRefreshBeforeTheExpiry(t *testing.T) {
	l := &Locker{opts: Options{WaiterTTL: DefaultWaiterTTL, WaitCap: 5 * time.Second}}
	a := &attempt{l: l, backoff: firstBackoff}
	sent := time.Now()
	remaining := DefaultWaiterTTL/3 + 5*time.Millisecond
	if d := a.nextTry(driver.Grant{Ahead: 0, Remaining: remaining}, sent).Sub(sent); d != remaining {
		t.Fatalf("expected the next try at the holder's expiry %v, got %v", remaining, d)
	}
	// A holder that outlives the place's refresh: the refresh comes first.
	if d := a.nextTry(driver.Grant{Ahead: 0, Remaining: DefaultWaiterTTL}, sent).Sub(sent); d != DefaultWaiterTTL/3 {
		t.Fatalf("expected the refresh at %v, got %v", DefaultWaiterTTL/3, d)
	}
}
