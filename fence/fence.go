package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold"
)

// Sentinel errors. Compare with errors.Is: they reach the caller wrapped.
var (
	// ErrStaleFence means the write carried a fence lower than the last
	// accepted one: another holder has written since. It is final for that
	// fence; retrying the same write cannot succeed.
	ErrStaleFence = errors.New("fence: stale fence")

	// ErrNotFound means the row or key to update does not exist (Table.Update,
	// Table.Read, Redis.Read). It is not a stale write.
	ErrNotFound = errors.New("fence: not found")

	// ErrNoFence means a write carried fence 0, which no lock store hands
	// out: the lease is degraded (fail-open, local-only) or the fence was
	// never set. Nothing was written.
	ErrNoFence = errors.New("fence: no fence token")

	// ErrInvalidFence means the fence cannot be stored, e.g. it exceeds
	// PostgreSQL's bigint.
	ErrInvalidFence = errors.New("fence: invalid fence")

	// ErrInvalidOptions is returned by the constructors for options that
	// cannot work, e.g. an empty table name.
	ErrInvalidOptions = errors.New("fence: invalid options")
)

// Resource is storage that applies a write only when its fence is not older
// than the last fence it accepted for key. Implementations must:
//
//   - apply the write when fence >= the last accepted fence for key (also when
//     key has never been written) and remember fence with the value, in one
//     atomic step;
//   - reject it with an error matching ErrStaleFence, changing nothing, when
//     fence is lower;
//   - reject fence 0 with ErrNoFence.
//
// Register, Table and Redis implement it.
type Resource interface {
	Write(ctx context.Context, key string, fence uint64, value []byte) error
}

// Write writes value to key in r with lease's fence.
//
// It refuses a nil lease and a degraded (fail-open) lease with an error
// matching ErrNoFence and writes nothing: a degraded lease has fence 0 and no
// cross-replica exclusion, so an unfenced write could overwrite a newer
// holder's data. Work that must run under fail-open should write unfenced
// storage on purpose, not through this function.
//
// Write does not check whether the lease is still held: a lease can end at any
// moment after such a check. The fence check in the storage is what rejects
// a holder whose lease has ended and been taken over.
func Write(ctx context.Context, r Resource, lease *leasehold.Lease, key string, value []byte) error {
	switch {
	case lease == nil:
		return fmt.Errorf("%w: nil lease", ErrNoFence)
	case lease.Degraded() || lease.Fence() == 0:
		return fmt.Errorf("%w: lease on %q is degraded (fail-open, fence 0); refusing to write %q unfenced", ErrNoFence, lease.Key(), key)
	}
	return r.Write(ctx, key, lease.Fence(), value)
}

// StaleError is the error a Resource returns for a stale write. It matches
// ErrStaleFence with errors.Is; use errors.As to read the fences.
type StaleError struct {
	Resource string // Event.Op of the resource: "memory", "postgres", "redis", ...
	Key      string // the row id or key written
	Fence    uint64 // the rejected fence
	Current  uint64 // the fence the resource held, when known; 0 when a concurrent writer won and its fence is unknown
}

// Error implements error.
func (e *StaleError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("fence: stale fence: %s write to %q with fence %d rejected: a write with a newer fence won", e.Resource, e.Key, e.Fence)
	}
	return fmt.Sprintf("fence: stale fence: %s write to %q with fence %d rejected: it holds fence %d", e.Resource, e.Key, e.Fence, e.Current)
}

// Unwrap returns ErrStaleFence.
func (e *StaleError) Unwrap() error { return ErrStaleFence }

// Reporter turns a rejected write into a *StaleError and an
// EventStaleWrite for its Observer. The resources in this module
// (Register, redisfence.Redis, pgfence.Table) use it; a Resource of your own
// can too, so its rejections are reported the same way.
type Reporter struct {
	Name     string             // Event.Locker, the metrics label; default leasehold.DefaultName
	Resource string             // Event.Op and StaleError.Resource; default "resource"
	Observer leasehold.Observer // receives EventStaleWrite; may be nil
}

// Stale reports a write to key with fence that was rejected because the
// resource holds current, and returns the error to give the writer (a
// *StaleError matching ErrStaleFence). Pass current 0 (or any value not
// above fence) when a concurrent writer won and its fence is unknown.
func (r Reporter) Stale(key string, fence, current uint64) error {
	name, resource := r.Name, r.Resource
	if name == "" {
		name = leasehold.DefaultName
	}
	if resource == "" {
		resource = "resource"
	}
	if r.Observer != nil {
		r.Observer.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: name, Key: key, Op: resource, Fence: fence})
	}
	if current <= fence {
		current = 0 // a concurrent writer won; what it wrote is not known
	}
	return &StaleError{Resource: resource, Key: key, Fence: fence, Current: current}
}

// CheckFence returns an error matching ErrNoFence for fence 0, which no lock
// store hands out, and nil otherwise. A Resource calls it before writing.
func CheckFence(fence uint64) error {
	if fence == 0 {
		return fmt.Errorf("%w: fence 0 (a degraded lease, or a fence that was never set)", ErrNoFence)
	}
	return nil
}
