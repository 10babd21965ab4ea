package leasehold

import (
	"context"
	"time"
)

// Store is what a Locker needs from a lock store. Implementations live in
// sub-packages (memstore, redisstore, etcdstore, pgstore) and must pass the
// conformance suite in package storetest against the real server.
//
// Every method is safe for concurrent use. A method that cannot reach the
// store returns an error that is not ErrNotAcquired, ErrNotOwned or ErrNotHeld;
// the Locker wraps it in a *StoreError.
type Store interface {
	// Acquire atomically takes key for token for ttl if the key is free, in
	// one round trip, and returns a fence that is strictly greater than every
	// fence this store ever returned for key.
	//
	// If key is already held by the same token (a retry after a lost reply)
	// Acquire succeeds, extends the TTL and returns the same fence.
	//
	// If another token holds key, Acquire returns ErrNotAcquired and a Grant
	// whose Remaining is the holder's remaining TTL (0 when unknown).
	Acquire(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)

	// Renew extends the TTL of key to ttl from now if and only if token owns
	// it, and returns ErrNotOwned otherwise. Renewing twice is harmless.
	Renew(ctx context.Context, key, token string, ttl time.Duration) error

	// Release deletes key if and only if token owns it, wakes waiters, and
	// returns ErrNotOwned otherwise (the other owner's lock stays). Releasing a
	// lock this token already released returns ErrNotOwned too.
	Release(ctx context.Context, key, token string) error

	// Inspect returns the current lock on key, or ErrNotHeld.
	Inspect(ctx context.Context, key string) (LockInfo, error)

	// List returns the locks whose key starts with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Notifier is implemented by stores that can tell waiters when a key is
// released (Redis pub/sub, etcd watch, an in-process channel). A Locker uses
// it when the store has it; otherwise waiters sleep until the holder's TTL
// runs out.
type Notifier interface {
	// WaitRelease subscribes to releases of key. The returned channel
	// receives a value (it is never closed) after key is released; stop ends
	// the subscription and must be called exactly once. Subscribe before
	// trying to acquire, so a release between the try and the wait is not
	// missed.
	WaitRelease(ctx context.Context, key string) (released <-chan struct{}, stop func(), err error)
}

// ForceReleaser is implemented by stores that can delete a lock without its
// token: the break-glass path of `leasehold release --force`.
type ForceReleaser interface {
	// ForceRelease deletes key whoever holds it and returns what it deleted,
	// or ErrNotHeld.
	ForceRelease(ctx context.Context, key string) (LockInfo, error)
}

// BatchRenewer is implemented by stores that can renew many locks in one
// round trip (a Redis pipeline). A Locker holding several leases that are due
// for renewal at about the same time renews them together: the one that is
// due takes along every other lease due within a quarter of RenewInterval.
type BatchRenewer interface {
	// RenewBatch renews every request as Store.Renew would and returns one
	// error per request, in order: nil, ErrNotOwned, or a store failure.
	RenewBatch(ctx context.Context, reqs []RenewRequest) []error
}

// RenewRequest is one lock to renew in a batch.
type RenewRequest struct {
	Key, Token string
	TTL        time.Duration
}

// Grant is what Store.Acquire reports.
type Grant struct {
	// Fence is the fence token of the acquisition (on success).
	Fence uint64
	// Remaining is the holder's remaining TTL when Acquire returned
	// ErrNotAcquired; 0 when unknown.
	Remaining time.Duration
}

// LockInfo describes a lock as the store sees it.
type LockInfo struct {
	Key       string            `json:"key"`
	Token     string            `json:"token"`
	Fence     uint64            `json:"fence"`
	Remaining time.Duration     `json:"remaining_ns"`
	Facts     map[string]string `json:"facts,omitempty"` // store-specific facts, e.g. the Redis key names
}
