package driver

import (
	"errors"
	"fmt"
)

// Errors a store returns; the root package re-exports them as the same values.
var (
	ErrNotAcquired      = errors.New("leasehold: not acquired")               // another owner holds the key, or waiters are ahead
	ErrNotOwned         = errors.New("leasehold: lock not owned")             // the token does not hold the key; the lock is left alone
	ErrNotHeld          = errors.New("leasehold: no lock held")               // nobody holds the key
	ErrNotQueued        = errors.New("leasehold: not queued")                 // the token has no live place in the key's queue
	ErrBadEntry         = errors.New("leasehold: bad store entry")            // an entry the store cannot decode
	ErrUnavailable      = errors.New("leasehold: store unavailable")          // a failure known to be an outage
	ErrMisconfigured    = errors.New("leasehold: store misconfigured")        // any other failure: retrying cannot fix it
	ErrAccessDenied     = fmt.Errorf("%w: access denied", ErrMisconfigured)   // refused credentials or permissions
	ErrInvalidKey       = errors.New("leasehold: invalid key")                // an unusable key
	ErrInvalidOptions   = errors.New("leasehold: invalid options")            // options or arguments that cannot work
	ErrConfigNotChecked = errors.New("leasehold: store settings not checked") // the store's user may not read its settings
)
