package leasehold

import (
	"errors"
	"fmt"
)

// Sentinel errors. Compare with errors.Is, never with ==: most of them reach
// the caller wrapped.
var (
	// ErrNotAcquired means the key is held by another owner. It is contention,
	// not a failure of the store, and never triggers the fail-open policy.
	ErrNotAcquired = errors.New("leasehold: not acquired")

	// ErrNotOwned means a release or renew was made with a token that no
	// longer owns the key (it expired or another owner holds it). The other
	// owner's lock was left alone.
	ErrNotOwned = errors.New("leasehold: lock not owned")

	// ErrNotHeld means no lock exists for the key: Inspect found none, or a
	// Release found the key already gone (expired, or deleted by a retry of
	// the same release).
	ErrNotHeld = errors.New("leasehold: no lock held")

	// ErrBadEntry means the store holds an entry it cannot decode (a corrupt
	// lock or fence value). Inspector.List skips such entries and reports
	// them with an error wrapping ErrBadEntry.
	ErrBadEntry = errors.New("leasehold: bad store entry")

	// ErrStore wraps every failure of the lock store itself (timeouts,
	// connection errors, outages): errors.Is(err, ErrStore) tells a sick store
	// apart from contention.
	ErrStore = errors.New("leasehold: store failure")

	// ErrUnavailable marks a store failure positively known to be an outage
	// of a reachable, correctly configured store: a refused or reset
	// connection, a dial or request timeout, a connection closed after it
	// had answered, a server that is loading or failing over. It is the only
	// store failure on which a FailOpen Locker returns a degraded lease.
	// Stores wrap such errors with it; it reaches the caller inside a
	// *StoreError, so it matches ErrStore as well.
	ErrUnavailable = errors.New("leasehold: store unavailable")

	// ErrMisconfigured marks a store failure that retrying cannot fix and
	// that is not an outage: wrong password, missing permission or ACL, a
	// TLS handshake or certificate failure, a server that speaks another
	// protocol, wrong key type, cross-slot keys, a missing table or schema,
	// an argument the server refuses, and every error a store cannot
	// classify. The Locker never fails open on it (nor on any error without
	// ErrUnavailable), and the CLI exits 77 (credentials, permissions) or 78
	// (other configuration) naming what to fix. It reaches the caller
	// inside a *StoreError, so it matches ErrStore as well.
	ErrMisconfigured = errors.New("leasehold: store misconfigured")

	// ErrAccessDenied is the ErrMisconfigured of refused credentials or
	// permissions (wrong password, no password, a role or ACL without the
	// store's keys, a missing privilege). It matches ErrMisconfigured too.
	ErrAccessDenied = fmt.Errorf("%w: access denied", ErrMisconfigured)

	// ErrInvalidKey is returned for an empty, oversized or otherwise
	// unusable key.
	ErrInvalidKey = errors.New("leasehold: invalid key")

	// ErrInvalidOptions is returned by New for options that cannot work.
	ErrInvalidOptions = errors.New("leasehold: invalid options")

	// ErrLockerClosed is returned by a Locker after Close, and is the cause of
	// the context of every lease that was still held when Close was called.
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
