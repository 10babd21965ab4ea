package leasehold

import (
	"fmt"
	"log/slog"
	"time"
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
	// may run the same work. Contention never fails open.
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

// Defaults used for zero Options fields.
const (
	DefaultTTL              = 30 * time.Second
	DefaultRenewTimeout     = 2 * time.Second
	DefaultMaxRenewFailures = 3
	DefaultReleaseTimeout   = 2 * time.Second
	DefaultWaitCap          = time.Second
	DefaultName             = "default"
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 512
)

// Options configure a Locker. The zero value is valid and means the
// documented defaults. New copies the struct, so changing it afterwards has no
// effect.
type Options struct {
	// Name labels this locker in metrics and logs: one per risk class, e.g.
	// "approval", "workflow", "reconciler". Default "default".
	Name string

	// TTL of every lease. Default 30 s. Must be > 0 when set.
	TTL time.Duration

	// RenewInterval between automatic renewals. Default TTL/3; must be < TTL.
	RenewInterval time.Duration

	// RenewTimeout bounds each renewal attempt. Default 2 s, capped at the
	// time left before local expiry; must be < TTL.
	RenewTimeout time.Duration

	// MaxRenewFailures is the number of consecutive failed renewals after
	// which a lease is abandoned (RenewalFence). Default 3. When
	// MaxRenewFailures × RenewInterval exceeds TTL, New logs a warning: the
	// local expiry guard will fire before the budget is used up.
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
	// caller's cancellation (the work context is usually already cancelled).
	// Default 2 s.
	ReleaseTimeout time.Duration

	// WaitCap is the longest a blocked Acquire sleeps between attempts when no
	// release notification arrives: the safety net under notifications and
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
	return ttl/20 + 5*time.Millisecond
}

func (o Options) withDefaults() (Options, error) {
	bad := func(format string, args ...any) (Options, error) {
		return o, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	switch {
	case o.TTL < 0:
		return bad("TTL must be > 0, got %v", o.TTL)
	case o.TTL == 0:
		o.TTL = DefaultTTL
	}
	switch {
	case o.RenewInterval < 0:
		return bad("RenewInterval must be > 0, got %v", o.RenewInterval)
	case o.RenewInterval == 0:
		o.RenewInterval = o.TTL / 3
	}
	if o.RenewInterval >= o.TTL {
		return bad("RenewInterval (%v) must be shorter than TTL (%v)", o.RenewInterval, o.TTL)
	}
	switch {
	case o.RenewTimeout < 0:
		return bad("RenewTimeout must be > 0, got %v", o.RenewTimeout)
	case o.RenewTimeout == 0:
		o.RenewTimeout = min(DefaultRenewTimeout, o.TTL/2)
	}
	if o.RenewTimeout >= o.TTL {
		return bad("RenewTimeout (%v) must be shorter than TTL (%v)", o.RenewTimeout, o.TTL)
	}
	switch {
	case o.MaxRenewFailures < 0:
		return bad("MaxRenewFailures must be >= 1, got %d", o.MaxRenewFailures)
	case o.MaxRenewFailures == 0:
		o.MaxRenewFailures = DefaultMaxRenewFailures
	}
	if o.OnRenewFailure != RenewalFence && o.OnRenewFailure != RenewalContinue {
		return bad("unknown OnRenewFailure %v", o.OnRenewFailure)
	}
	if o.OnStoreError != FailClosed && o.OnStoreError != FailOpen {
		return bad("unknown OnStoreError %v", o.OnStoreError)
	}
	if o.MaxHold < 0 {
		return bad("MaxHold must be >= 0, got %v", o.MaxHold)
	}
	if o.DriftMargin < 0 {
		return bad("DriftMargin must be >= 0, got %v", o.DriftMargin)
	}
	if o.drift(o.TTL) >= o.TTL {
		return bad("DriftMargin (%v) must be shorter than TTL (%v)", o.DriftMargin, o.TTL)
	}
	switch {
	case o.ReleaseTimeout < 0:
		return bad("ReleaseTimeout must be > 0, got %v", o.ReleaseTimeout)
	case o.ReleaseTimeout == 0:
		o.ReleaseTimeout = DefaultReleaseTimeout
	}
	switch {
	case o.WaitCap < 0:
		return bad("WaitCap must be > 0, got %v", o.WaitCap)
	case o.WaitCap == 0:
		o.WaitCap = DefaultWaitCap
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	return o, nil
}
