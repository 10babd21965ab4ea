package leasehold

import (
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/driver"
)

// Sentinel errors. Compare with errors.Is: most reach the caller wrapped.
// Those a store returns are package driver's, as the same values.
var (
	// ErrNotAcquired means another owner holds the key (contention, not a
	// store failure; it never triggers FailOpen).
	ErrNotAcquired = driver.ErrNotAcquired

	// ErrNotOwned means a release or renew used a token that no longer owns
	// the key; the other owner's lock was left alone.
	ErrNotOwned = driver.ErrNotOwned

	// ErrNotHeld means no lock exists for the key.
	ErrNotHeld = driver.ErrNotHeld

	// ErrBadEntry means the store holds an entry it cannot decode.
	ErrBadEntry = driver.ErrBadEntry

	// ErrStore wraps every failure of the store itself (see StoreError).
	ErrStore = errors.New("leasehold: store failure")

	// ErrUnavailable marks a store failure known to be an outage: the only
	// one on which a FailOpen Locker returns a degraded lease. It matches
	// ErrStore too.
	ErrUnavailable = driver.ErrUnavailable

	// ErrMisconfigured marks a store failure that retrying cannot fix
	// (credentials, TLS, schema, protocol, anything unclassified). It never
	// fails open; the CLI exits 77 or 78 naming what to fix.
	ErrMisconfigured = driver.ErrMisconfigured

	// ErrAccessDenied is the ErrMisconfigured of refused credentials or
	// permissions.
	ErrAccessDenied = driver.ErrAccessDenied

	// ErrInvalidKey is returned for an empty, oversized or unusable key.
	ErrInvalidKey = driver.ErrInvalidKey

	// ErrInvalidOptions is returned by New for options that cannot work.
	ErrInvalidOptions = driver.ErrInvalidOptions

	// ErrLockerClosed is returned by a Locker after Close, and is the cause
	// of the context of every lease still held then.
	ErrLockerClosed = errors.New("leasehold: locker closed")
)

// Causes with which a lease's context is cancelled. context.Cause(lease.Context())
// returns one of them, and errors.Is works on the error Do returns.
var (
	// ErrLeaseLost means the store answered that another owner holds the key
	// or that our lock expired.
	ErrLeaseLost = errors.New("leasehold: lease lost")

	// ErrLeaseAbandoned means the store could not be reached for the whole
	// renewal failure budget; ownership can no longer be trusted.
	ErrLeaseAbandoned = errors.New("leasehold: lease abandoned: renewal failed")

	// ErrLeaseExpired means the holder's own clock says the TTL ran out since
	// the last successful renewal (the local expiry guard fired).
	ErrLeaseExpired = errors.New("leasehold: lease expired locally")

	// ErrLeaseReleased means the holder released the lease.
	ErrLeaseReleased = errors.New("leasehold: lease released")

	// ErrMaxHoldReached means the lease reached the locker's MaxHold and
	// automatic renewal stopped.
	ErrMaxHoldReached = errors.New("leasehold: maximum hold time reached")
)

// StoreError is a failure of the store during one operation. It matches
// ErrStore and the underlying error with errors.Is.
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
