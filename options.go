package leasehold

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// RenewalPolicy says what a lease does when automatic renewal keeps failing.
type RenewalPolicy int

const (
	// RenewalFence (the default) abandons the lease after MaxRenewFailures
	// consecutive failures and cancels its context with ErrLeaseAbandoned; the
	// local expiry guard cancels it with ErrLeaseExpired when the TTL runs out
	// first. Use it for work whose duplicate corrupts state.
	RenewalFence RenewalPolicy = iota
	// RenewalContinue logs and counts every failure and keeps going, also past
	// the TTL, for work whose duplicates are cheap. A renewal answered "not
	// owned" still cancels the context with ErrLeaseLost: another owner
	// provably has the key.
	RenewalContinue
)

// String returns "fence" or "continue".
func (p RenewalPolicy) String() string {
	switch p {
	case RenewalFence:
		return "fence"
	case RenewalContinue:
		return "continue"
	}
	return fmt.Sprintf("RenewalPolicy(%d)", int(p))
}

// StorePolicy says what acquiring does when the store itself fails.
type StorePolicy int

const (
	// FailClosed (the default) returns the store's error: nothing runs.
	FailClosed StorePolicy = iota
	// FailOpen returns a local-only lease with Degraded() == true and fence 0:
	// goroutines of this process still exclude each other, but other replicas
	// may run the same work, only when the store's error is an outage
	// (ErrUnavailable). Contention, configuration errors and every error
	// the store did not classify as an outage fail closed.
	FailOpen
)

// String returns "fail-closed" or "fail-open".
func (p StorePolicy) String() string {
	switch p {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	}
	return fmt.Sprintf("StorePolicy(%d)", int(p))
}

// Defaults used for zero Options fields, and the floors New enforces.
const (
	DefaultTTL = 30 * time.Second
	// DefaultRenewTimeout caps the default RenewTimeout (see Options).
	DefaultRenewTimeout     = 2 * time.Second
	DefaultMaxRenewFailures = 3
	DefaultReleaseTimeout   = 2 * time.Second
	DefaultWaitCap          = time.Second
	// DefaultWaiterTTL keeps a waiter's place in a key's queue. A waiter
	// refreshes it every WaiterTTL/3 (one store call a second per waiter),
	// and a waiter that died holds the queue up for at most this long: long
	// enough to ride out a slow round trip or a GC pause, short next to the
	// TTLs leases are used with.
	DefaultWaiterTTL = 3 * time.Second
	DefaultName      = "default"
	// MinRenewInterval is the shortest RenewInterval (and Loop interval, and
	// gap between renewal retries) New accepts: renewing a lease more than a
	// hundred times a second only loads the store.
	MinRenewInterval = 10 * time.Millisecond
	// MinWaiterTTL is the shortest WaiterTTL New accepts.
	MinWaiterTTL = 3 * MinRenewInterval
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 512
	// MaxIdentityLen is the longest Identity accepted, in bytes.
	MaxIdentityLen = 256
)

// Options configure a Locker. The zero value is valid and means the
// documented defaults. New copies the struct, so changing it afterwards has no
// effect.
type Options struct {
	// Name labels this locker in metrics and logs: one per risk class, e.g.
	// "approval", "workflow", "reconciler". Default "default".
	Name string

	// Identity names this process as a holder: stored with every lock it
	// takes (LockInfo.Holder, `leasehold ls`) and written in every log
	// record of a lease ("holder"). Printable, at most MaxIdentityLen bytes.
	// Default "hostname/pid".
	Identity string

	// TTL of every lease. Default 30 s. Must be > 0 when set.
	TTL time.Duration

	// RenewInterval between automatic renewals. Default TTL/3; must be < TTL
	// and >= MinRenewInterval.
	RenewInterval time.Duration

	// RenewTimeout bounds each renewal attempt. Must be < TTL. Default: a
	// timeout that lets MaxRenewFailures attempts fit before the local
	// expiry guard with room to spare (DefaultRenewTimeoutFor), at most
	// DefaultRenewTimeout (2 s) and at least MinRenewInterval. See Budget.
	RenewTimeout time.Duration

	// MaxRenewFailures is the number of consecutive failed renewals after
	// which a lease is abandoned (RenewalFence). Default 3. After a failure
	// the remaining attempts are spread over the time left before the local
	// expiry guard; when they cannot fit (Budget().Fits() is false) New logs
	// a warning: the guard will end such leases first.
	MaxRenewFailures int

	// OnRenewFailure: RenewalFence (default) or RenewalContinue.
	OnRenewFailure RenewalPolicy

	// OnStoreError: FailClosed (default) or FailOpen.
	OnStoreError StorePolicy

	// MaxHold caps automatic renewal: after MaxHold since acquisition the
	// lease's context is cancelled with ErrMaxHoldReached and renewal stops.
	// Zero means no cap.
	MaxHold time.Duration

	// DriftMargin is subtracted from the TTL by the local expiry guard so the
	// holder learns of expiry before the store does. Default (zero): the
	// lease's TTL/20 + 5 ms. It only matters while renewals fail, and it must
	// cover clock-rate drift plus the holder's own scheduling delay (timer
	// latency on a loaded machine), so it is more generous than Redlock's 1 %.
	DriftMargin time.Duration

	// ReleaseTimeout bounds Release, which runs on a context detached from the
	// caller's cancellation (the work context is usually already cancelled),
	// and every clean-up release the Locker makes on its own. Default 2 s.
	ReleaseTimeout time.Duration

	// WaiterTTL is how long a blocked Acquire keeps its place in the key's
	// queue without refreshing it; it refreshes every WaiterTTL/3. Default
	// 3 s (DefaultWaiterTTL), at least MinWaiterTTL.
	WaiterTTL time.Duration

	// WaitCap is the longest a blocked Acquire sleeps between attempts when no
	// wake-up arrives: the safety net under store notifications and
	// TTL-based wake-ups. Default 1 s.
	WaitCap time.Duration

	// Logger receives the locker's records. Default slog.Default().
	Logger *slog.Logger

	// Observer receives events for metrics. Default: none.
	Observer Observer
}

// drift returns the local guard's margin for a lease of ttl.
func (o Options) drift(ttl time.Duration) time.Duration {
	if o.DriftMargin > 0 {
		return o.DriftMargin
	}
	return DefaultDriftMargin(ttl)
}

// DefaultDriftMargin returns the default DriftMargin for a lease of ttl:
// ttl/20 + 5 ms.
func DefaultDriftMargin(ttl time.Duration) time.Duration { return ttl/20 + 5*time.Millisecond }

// Budget is the renewal failure budget arithmetic, the one formula New's
// warning and `leasehold calibrate` share. Measured from the moment the last
// successful renewal was sent: the first attempt that may fail starts after
// RenewInterval; after a failure the attempts left are spread over the time
// before the local guard, at least MinRenewInterval apart, and each takes at
// most RenewTimeout. They fit when the last one ends no later than the local
// expiry guard, TTL − DriftMargin; then a lease whose renewals keep failing
// is abandoned (ErrLeaseAbandoned) by its budget, not expired by its guard.
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

// DefaultRenewTimeoutFor returns the default RenewTimeout for a TTL, renew
// interval, drift margin and failure budget: the time the budget has, ttl −
// drift − interval − (failures − 1) × MinRenewInterval, divided by
// failures + 1, at most DefaultRenewTimeout (and TTL/2) and at least
// MinRenewInterval. One attempt's worth of time is left over for scheduling
// delays, so the budget fits with room to spare.
func DefaultRenewTimeoutFor(ttl, interval, drift time.Duration, failures int) time.Duration {
	n := time.Duration(max(failures, 1))
	d := (ttl - drift - interval - (n-1)*MinRenewInterval) / (n + 1)
	return min(max(min(d, DefaultRenewTimeout), MinRenewInterval), ttl/2)
}

// Budget returns o's failure budget with defaults filled in, or the error
// New would return for o.
func (o Options) Budget() (Budget, error) {
	d, err := o.withDefaults()
	if err != nil {
		return Budget{}, err
	}
	return d.budget(), nil
}

func (o Options) budget() Budget {
	return Budget{TTL: o.TTL, RenewInterval: o.RenewInterval, RenewTimeout: o.RenewTimeout,
		DriftMargin: o.drift(o.TTL), MaxRenewFailures: o.MaxRenewFailures}
}

// optionError returns an error wrapping ErrInvalidOptions.
func optionError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
}

// durationDefault fills *d with def when zero and rejects negative values.
func durationDefault(name string, d *time.Duration, def time.Duration) error {
	switch {
	case *d < 0:
		return optionError("%s must be > 0, got %v", name, *d)
	case *d == 0:
		*d = def
	}
	return nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	steps := []func() error{o.timingDefaults, o.renewDefaults, o.policyChecks, o.waitDefaults, o.identityDefault}
	for _, step := range steps {
		if err := step(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// timingDefaults sets and checks TTL, RenewInterval and DriftMargin.
func (o *Options) timingDefaults() error {
	if err := durationDefault("TTL", &o.TTL, DefaultTTL); err != nil {
		return err
	}
	if err := durationDefault("RenewInterval", &o.RenewInterval, o.TTL/3); err != nil {
		return err
	}
	switch {
	case o.RenewInterval >= o.TTL:
		return optionError("RenewInterval (%v) must be shorter than TTL (%v)", o.RenewInterval, o.TTL)
	case o.RenewInterval < MinRenewInterval:
		return optionError("RenewInterval (%v) must be at least %v (MinRenewInterval)", o.RenewInterval, MinRenewInterval)
	case o.DriftMargin < 0:
		return optionError("DriftMargin must be >= 0, got %v", o.DriftMargin)
	case o.drift(o.TTL) >= o.TTL:
		return optionError("DriftMargin (%v) must be shorter than TTL (%v)", o.DriftMargin, o.TTL)
	}
	return nil
}

// renewDefaults sets and checks MaxRenewFailures and RenewTimeout.
func (o *Options) renewDefaults() error {
	switch {
	case o.MaxRenewFailures < 0:
		return optionError("MaxRenewFailures must be >= 1, got %d", o.MaxRenewFailures)
	case o.MaxRenewFailures == 0:
		o.MaxRenewFailures = DefaultMaxRenewFailures
	}
	def := DefaultRenewTimeoutFor(o.TTL, o.RenewInterval, o.drift(o.TTL), o.MaxRenewFailures)
	if err := durationDefault("RenewTimeout", &o.RenewTimeout, def); err != nil {
		return err
	}
	if o.RenewTimeout >= o.TTL {
		return optionError("RenewTimeout (%v) must be shorter than TTL (%v)", o.RenewTimeout, o.TTL)
	}
	return nil
}

// policyChecks checks the policies and MaxHold.
func (o *Options) policyChecks() error {
	switch {
	case o.OnRenewFailure != RenewalFence && o.OnRenewFailure != RenewalContinue:
		return optionError("unknown OnRenewFailure %v", o.OnRenewFailure)
	case o.OnStoreError != FailClosed && o.OnStoreError != FailOpen:
		return optionError("unknown OnStoreError %v", o.OnStoreError)
	case o.MaxHold < 0:
		return optionError("MaxHold must be >= 0, got %v", o.MaxHold)
	}
	return nil
}

// waitDefaults sets and checks ReleaseTimeout, WaiterTTL and WaitCap.
func (o *Options) waitDefaults() error {
	if err := durationDefault("ReleaseTimeout", &o.ReleaseTimeout, DefaultReleaseTimeout); err != nil {
		return err
	}
	if err := durationDefault("WaitCap", &o.WaitCap, DefaultWaitCap); err != nil {
		return err
	}
	if err := durationDefault("WaiterTTL", &o.WaiterTTL, DefaultWaiterTTL); err != nil {
		return err
	}
	if o.WaiterTTL < MinWaiterTTL {
		return optionError("WaiterTTL (%v) must be at least %v (MinWaiterTTL)", o.WaiterTTL, MinWaiterTTL)
	}
	return nil
}

// identityDefault sets and checks Identity.
func (o *Options) identityDefault() error {
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	return validateIdentity(o.Identity)
}

func defaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

func validateIdentity(id string) error {
	if len(id) > MaxIdentityLen {
		return optionError("Identity is %d bytes; the limit is %d", len(id), MaxIdentityLen)
	}
	if !utf8.ValidString(id) {
		return optionError("Identity is not valid UTF-8")
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return optionError("Identity contains a non-printable character %q", r)
		}
	}
	return nil
}
