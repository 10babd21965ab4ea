package calibrate

import "time"

// Timing floors and defaults, the leasehold core's (it re-exports them).
const (
	// MinRenewInterval is the shortest renewal interval (and retry gap) the
	// core accepts.
	MinRenewInterval = 10 * time.Millisecond
	// DefaultRenewTimeout caps the default renew timeout.
	DefaultRenewTimeout = 2 * time.Second
	// DefaultMaxFailures is the default failure budget.
	DefaultMaxFailures = 3
)

// Budget is the renewal failure budget arithmetic, the one formula the
// Locker's warning and Compute share. Measured from the moment the last
// successful renewal was sent: the first attempt that may fail starts after
// RenewInterval; after a failure the attempts left are spread over the time
// before the local guard, at least MinRenewInterval apart, and each takes at
// most RenewTimeout. They fit when the last one ends no later than the local
// expiry guard, TTL − DriftMargin; then a lease whose renewals keep failing
// is abandoned by its budget, not expired by its guard.
type Budget struct {
	TTL, RenewInterval, RenewTimeout, DriftMargin time.Duration
	MaxRenewFailures                              int
}

// Need returns RenewInterval + MaxRenewFailures × RenewTimeout +
// (MaxRenewFailures − 1) × MinRenewInterval: the time, after the last
// success, by which every attempt of the budget has failed.
func (b Budget) Need() time.Duration {
	n := time.Duration(b.MaxRenewFailures)
	return b.RenewInterval + n*b.RenewTimeout + max(n-1, 0)*MinRenewInterval
}

// Have returns TTL − DriftMargin: when the local expiry guard fires.
func (b Budget) Have() time.Duration { return b.TTL - b.DriftMargin }

// Fits reports Need() <= Have().
func (b Budget) Fits() bool { return b.Need() <= b.Have() }

// DriftMargin returns the core's default drift margin for a lease of ttl:
// ttl/20 + 5 ms. It only matters while renewals fail, and covers clock-rate
// drift plus the holder's own scheduling delay (timer latency on a loaded
// machine), so it is more generous than Redlock's 1 %.
func DriftMargin(ttl time.Duration) time.Duration { return ttl/20 + 5*time.Millisecond }

// RenewTimeoutFor returns the core's default renew timeout for a TTL, renew
// interval, drift margin and failure budget: the time the budget has, ttl −
// drift − interval − (failures − 1) × MinRenewInterval, divided by
// failures + 1, at most DefaultRenewTimeout (and TTL/2) and at least
// MinRenewInterval. One attempt's worth of time is left over for scheduling
// delays, so the budget fits with room to spare.
func RenewTimeoutFor(ttl, interval, drift time.Duration, failures int) time.Duration {
	n := time.Duration(max(failures, 1))
	d := (ttl - drift - interval - (n-1)*MinRenewInterval) / (n + 1)
	return min(max(min(d, DefaultRenewTimeout), MinRenewInterval), ttl/2)
}
