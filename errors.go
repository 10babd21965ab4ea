package leasehold

import (
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/driver"
)

// Sentinel errors; compare with errors.Is. Those a store returns are
// package driver's, as the same values.
var (
	ErrNotAcquired    = driver.ErrNotAcquired // another owner holds the key (contention, never fails open)
	ErrNotOwned       = driver.ErrNotOwned    // the token no longer owns the key; the owner's lock is untouched
	ErrNotHeld        = driver.ErrNotHeld     // no lock exists for the key
	ErrBadEntry       = driver.ErrBadEntry    // the store holds an entry it cannot decode
	ErrInvalidKey     = driver.ErrInvalidKey
	ErrInvalidOptions = driver.ErrInvalidOptions
	ErrLockerClosed   = errors.New("leasehold: locker closed") // also the cause of leases held at Close

	ErrStore         = errors.New("leasehold: store failure") // every store failure (a *StoreError)
	ErrUnavailable   = driver.ErrUnavailable                  // an outage: the only failure FailOpen acts on
	ErrMisconfigured = driver.ErrMisconfigured                // retrying cannot fix it
	ErrAccessDenied  = driver.ErrAccessDenied                 // the ErrMisconfigured of refused credentials
)

// Causes of a lease's end: context.Cause(lease.Context()), and matched by
// errors.Is on Do's error.
var (
	ErrLeaseLost      = errors.New("leasehold: lease lost")                      // the store says another owner holds it, or it expired
	ErrLeaseAbandoned = errors.New("leasehold: lease abandoned: renewal failed") // the renewal failure budget ran out
	ErrLeaseExpired   = errors.New("leasehold: lease expired locally")           // the local expiry guard fired
	ErrLeaseReleased  = errors.New("leasehold: lease released")
	ErrMaxHoldReached = errors.New("leasehold: maximum hold time reached")
)

// StoreError is a store failure; it matches ErrStore and the store's error.
type StoreError struct {
	Op  string // "acquire", "renew", "release", "inspect", "list"
	Key string
	Err error
}

// Error implements error.
func (e *StoreError) Error() string {
	return fmt.Sprintf("leasehold: store failure during %s of %q: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns ErrStore and the store's own error.
func (e *StoreError) Unwrap() []error { return []error{ErrStore, e.Err} }

func storeErr(op, key string, err error) error {
	var se *StoreError
	if errors.As(err, &se) {
		return err
	}
	return &StoreError{Op: op, Key: key, Err: err}
}
