// Package doctor checks the settings of a lock store that can lose a lock
// without any error: Redis eviction and replication, PostgreSQL
// privileges and durability, etcd security and member lag, and the clock
// offset between this host and the store. Each check returns one Result
// with what it saw, why that matters for a lock and the exact fix; the
// leasehold doctor command prints them.
//
// A check that needs a right the connecting user lacks returns StatusSkip
// and names the right, rather than failing.
package doctor

import (
	"time"
)

// Status is the verdict of one check.
type Status string

// Verdicts, from best to worst; Skip says the check could not run.
const (
	OK   Status = "OK"
	Skip Status = "SKIP"
	Warn Status = "WARN"
	Fail Status = "FAIL"
)

// Result is the outcome of one check.
type Result struct {
	// Check names the check (stable, snake_case: "redis_eviction").
	Check  string `json:"check"`
	Status Status `json:"status"`
	// Seen is what the check found on the server.
	Seen string `json:"seen"`
	// Why says, in one sentence, why the finding matters for a lock;
	// empty for OK.
	Why string `json:"why,omitempty"`
	// Fix is the exact configuration line or SQL that resolves a WARN or
	// FAIL, or the right to grant for a SKIP.
	Fix string `json:"fix,omitempty"`
}

// Failed reports whether any result is a FAIL.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// Options tune the checks. The zero value means the defaults.
type Options struct {
	// MaxClockOffset is the largest offset between this host's clock and
	// the store's that passes the clock check, beyond the uncertainty of
	// the measurement (half the round trip). Default 500 ms.
	MaxClockOffset time.Duration
	// Now is this host's clock. Default time.Now.
	Now func() time.Time
}

// DefaultMaxClockOffset is the default Options.MaxClockOffset.
const DefaultMaxClockOffset = 500 * time.Millisecond

func (o Options) withDefaults() Options {
	if o.MaxClockOffset <= 0 {
		o.MaxClockOffset = DefaultMaxClockOffset
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// clockResult judges the offset between this host's clock and a store's
// (server), read between the local readings before and after.
func clockResult(check, store, fix string, o Options, before, server, after time.Time) Result {
	rtt := after.Sub(before)
	offset := server.Sub(before.Add(rtt / 2))
	r := Result{Check: check, Status: OK,
		Seen: "offset " + offset.Round(time.Millisecond).String() + " (± " + (rtt / 2).Round(time.Millisecond).String() + ") between this host and " + store}
	if abs(offset)-rtt/2 > o.MaxClockOffset {
		r.Status = Warn
		r.Why = "the store expires leases by its own wall clock and the holder's expiry guard assumes clocks that differ in rate, not in offset: an offset this large means a clock is unsynchronised or was stepped, and a server clock stepped forward ends every lease early while its holder still runs"
		r.Fix = fix
	}
	return r
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
