package leasehold

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasehold/leasehold/calibrate"
)

// RenewalPolicy says what a lease does when renewal keeps failing.
type RenewalPolicy int

const (
	// RenewalFence (the default) abandons the lease after MaxRenewFailures
	// consecutive failures (ErrLeaseAbandoned), or at the local expiry guard.
	RenewalFence RenewalPolicy = iota
	// RenewalContinue logs and counts failures and keeps going, also past
	// the TTL; "not owned" still ends the lease (ErrLeaseLost).
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

// StorePolicy says what acquiring does when the store fails.
type StorePolicy int

const (
	// FailClosed (the default) returns the store's error: nothing runs.
	FailClosed StorePolicy = iota
	// FailOpen returns a degraded, local-only lease (fence 0) on an outage
	// (ErrUnavailable) only; every other error fails closed.
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
	DefaultTTL              = 30 * time.Second
	DefaultRenewTimeout     = calibrate.DefaultRenewTimeout // the cap of the default RenewTimeout
	DefaultMaxRenewFailures = calibrate.DefaultMaxFailures
	DefaultReleaseTimeout   = 2 * time.Second
	DefaultWaitCap          = time.Second
	DefaultWaiterTTL        = 3 * time.Second
	DefaultName             = "default"
	MinRenewInterval        = calibrate.MinRenewInterval // also the shortest Loop interval
	MinWaiterTTL            = 3 * MinRenewInterval
	MaxKeyLen               = 512 // bytes
	MaxIdentityLen          = 256 // bytes
)

// Options configure a Locker. The zero value means the defaults; New copies
// the struct.
type Options struct {
	Name             string        // metrics and logs label, one per risk class; default "default"
	Identity         string        // stored with each lock, logged as holder; default "hostname/pid"
	TTL              time.Duration // of every lease; default 30 s
	RenewInterval    time.Duration // between automatic renewals; default TTL/3
	RenewTimeout     time.Duration // per renewal; default calibrate.RenewTimeoutFor, at most 2 s
	MaxRenewFailures int           // failed renewals in a row that abandon a lease; default 3
	OnRenewFailure   RenewalPolicy // default RenewalFence
	OnStoreError     StorePolicy   // default FailClosed
	MaxHold          time.Duration // ends a lease with ErrMaxHoldReached; default 0, no cap
	DriftMargin      time.Duration // the local guard ends a lease this long before its TTL; default TTL/20 + 5 ms
	ReleaseTimeout   time.Duration // per release; default 2 s
	WaiterTTL        time.Duration // a waiter's place in the queue, refreshed every WaiterTTL/3; default 3 s
	WaitCap          time.Duration // the longest a waiter goes without a check of its key; default 1 s
	Logger           *slog.Logger  // default slog.Default()
	Observer         Observer      // default none
}

// drift returns the local guard's margin for a lease of ttl.
func (o Options) drift(ttl time.Duration) time.Duration {
	if o.DriftMargin > 0 {
		return o.DriftMargin
	}
	return calibrate.DriftMargin(ttl)
}

// Budget returns o's renewal failure budget with defaults, or New's error.
func (o Options) Budget() (calibrate.Budget, error) {
	d, err := o.withDefaults()
	if err != nil {
		return calibrate.Budget{}, err
	}
	return d.budget(), nil
}

func (o Options) budget() calibrate.Budget {
	return calibrate.Budget{TTL: o.TTL, RenewInterval: o.RenewInterval, RenewTimeout: o.RenewTimeout,
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
	def := calibrate.RenewTimeoutFor(o.TTL, o.RenewInterval, o.drift(o.TTL), o.MaxRenewFailures)
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
