package driver

import (
	"errors"
	"fmt"
)

// Errors a store returns. The root package re-exports them as the same values.
var (
	// ErrNotAcquired: another owner holds the key, or waiters are ahead.
	ErrNotAcquired = errors.New("leasehold: not acquired")
	// ErrNotOwned: the token does not hold the key; the holder's lock is left alone.
	ErrNotOwned = errors.New("leasehold: lock not owned")
	// ErrNotHeld: nobody holds the key.
	ErrNotHeld = errors.New("leasehold: no lock held")
	// ErrBadEntry: the store holds an entry it cannot decode.
	ErrBadEntry = errors.New("leasehold: bad store entry")
	// ErrUnavailable marks a store failure known to be an outage.
	ErrUnavailable = errors.New("leasehold: store unavailable")
	// ErrMisconfigured marks a store failure that retrying cannot fix, and
	// every failure the store cannot classify.
	ErrMisconfigured = errors.New("leasehold: store misconfigured")
	// ErrAccessDenied is the ErrMisconfigured of refused credentials or
	// permissions.
	ErrAccessDenied = fmt.Errorf("%w: access denied", ErrMisconfigured)
	// ErrInvalidKey: an empty, oversized or otherwise unusable key.
	ErrInvalidKey = errors.New("leasehold: invalid key")
	// ErrInvalidOptions: options or arguments that cannot work.
	ErrInvalidOptions = errors.New("leasehold: invalid options")
	// ErrConfigNotChecked: the store's user may not read the settings.
	ErrConfigNotChecked = errors.New("leasehold: store settings not checked")
)
