package driver

import (
	"context"
	"time"
)

// Store is what a Locker calls. Each method is one round trip, checked on the
// server.
type Store interface {
	// Acquire takes req.Key for req.Token for req.TTL when the queue rule
	// allows it, records req.Holder, removes the token from the queue and
	// returns a fence strictly greater than every fence the store returned
	// for the key, also after it lost its data. A token that already holds
	// the key gets its TTL extended and the same fence. Otherwise it returns
	// ErrNotAcquired and a Grant with what it saw; with req.QueueTTL > 0 the
	// token joins (or keeps) its place in the queue.
	Acquire(ctx context.Context, req AcquireRequest) (Grant, error)

	// Renew extends key's TTL to ttl from now if token holds it, else
	// returns ErrNotOwned.
	Renew(ctx context.Context, key, token string, ttl time.Duration) error

	// Release deletes key if token holds it and removes token from the
	// queue. When that leaves key free it wakes the queue's new head (only
	// the head, where the store can address it; with no queue, every
	// subscriber of key), or hands the key to it. It returns ErrNotOwned
	// when another token holds key (left alone), ErrNotHeld when nobody does.
	Release(ctx context.Context, key, token string) error
}

// AcquireRequest is one acquire attempt.
type AcquireRequest struct {
	Key, Token string
	TTL        time.Duration
	Holder     string        // the holder's identity, shown by Inspect
	QueueTTL   time.Duration // > 0: a waiting acquire (see Store.Acquire)
	// Kept > 0 (a PresenceKeeper's waiter): the place lives Kept instead of
	// QueueTTL, but no longer than the Store's presence.
	Kept time.Duration
}

// Grant is what an acquire saw.
type Grant struct {
	Fence uint64 // on success
	// On ErrNotAcquired: the holder's remaining TTL, counted from when the
	// request was sent or later (0 when the key is free but others wait
	// ahead, or unknown), its identity, and the live waiters ahead of the
	// token (the whole queue for one that did not queue).
	Remaining time.Duration
	Holder    string
	Ahead     int
}

// Notifier wakes waiters; a Locker without it polls.
type Notifier interface {
	// WaitRelease subscribes token's wake-ups for key (see the package doc),
	// returning once the subscription is live or ctx ends. The channel, never
	// closed, receives a Wake when token may now take key and after every
	// reconnect of the notification path; stores that cannot address one
	// waiter may wake every waiter of key. An empty token subscribes an
	// observer, woken on every release and change of queue head. stop ends
	// the subscription.
	WaitRelease(ctx context.Context, key, token string) (wake <-chan Wake, stop func(), err error)
}

// Wake is one wake-up: zero to check again, or a hand-off of the key.
type Wake struct {
	Fence uint64        // the granted lock's fence
	TTL   time.Duration // the TTL granted, the one of the waiter's last waiting Acquire
}

// LiveNotifier is a Notifier that reports whether WaitRelease for key would
// cost no round trip (a subscription already open in this process), so a
// waiter subscribes before its first Acquire.
type LiveNotifier interface {
	Notifier
	Live(key string) bool
}

// Inspector describes locks, for elections and the CLI.
type Inspector interface {
	// Inspect returns key's lock, or ErrNotHeld.
	Inspect(ctx context.Context, key string) (LockInfo, error)
	// List returns the locks whose key starts with prefix, sorted by key;
	// entries it cannot decode are skipped and reported in an error wrapping
	// ErrBadEntry, beside the good ones.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// LockInfo describes a lock as the store sees it.
type LockInfo struct {
	Key        string            `json:"key"`
	Token      string            `json:"token"`
	Holder     string            `json:"holder,omitempty"`
	Fence      uint64            `json:"fence"`
	Remaining  time.Duration     `json:"remaining_ns"`
	Waiting    int               `json:"waiting"`               // live waiters queued
	NextHolder string            `json:"next_holder,omitempty"` // the queue head's identity
	Facts      map[string]string `json:"facts,omitempty"`       // store-specific, e.g. key names
}

// ForceReleaser deletes a lock without its token (`leasehold release
// --force`).
type ForceReleaser interface {
	// ForceRelease deletes key and returns what it deleted, or ErrNotHeld.
	ForceRelease(ctx context.Context, key string) (LockInfo, error)
}

// BatchRenewer renews many locks in one round trip.
type BatchRenewer interface {
	// RenewBatch renews each request as Renew would and returns one error
	// per request, in order.
	RenewBatch(ctx context.Context, reqs []RenewRequest) []error
}

// RenewRequest is one lock to renew in a batch.
type RenewRequest struct {
	Key, Token string
	TTL        time.Duration
}

// QueueRefresher keeps many waiters' places in their keys' queues in one
// round trip, for far less than an Acquire each.
type QueueRefresher interface {
	// RefreshQueue extends each token's live queue entry to QueueTTL from
	// now (never shortens it), as its waiting Acquire would, and returns one
	// error per request, in order: nil while another token holds the key;
	// ErrNotQueued when the token has no live entry (nothing is created);
	// ErrNotHeld when the entry was extended but nobody holds the key. It
	// never grants a key; a waiter that gets an error sends an Acquire. A
	// successful refresh counts as the waiting Acquire for a hand-off's
	// queue deadline.
	RefreshQueue(ctx context.Context, reqs []QueueRefresh) []error
}

// QueueRefresh is one waiter's place to keep.
type QueueRefresh struct {
	Key, Token string
	QueueTTL   time.Duration
	Kept       time.Duration // as in AcquireRequest
}

// PresenceKeeper is a QueueRefresher whose places can be kept by one
// presence per Store instead of each by its own refreshes. A place queued
// or refreshed with Kept > 0 lives until the earlier of Kept from then and
// the end of the presence: a process that stops keeping its presence loses
// all its places when its last KeepPresence's ttl runs out, and a live one
// refreshes a place only every Kept/3. A place once kept stays kept: an
// Acquire or refresh without Kept (one sent before the presence was first
// kept, applied late) never shortens it. A release or acquire that hands the
// key to such a place caps the grant at that deadline. An Acquire that finds
// the key free and such a place at the head hands the key to it (the place
// may be one its process forgot, which would otherwise hold up the queue).
// A store may end a kept place with the presence alone, never at Kept
// (etcdstore: a lease kept alive cannot end one key early; see its docs).
type PresenceKeeper interface {
	QueueRefresher
	// KeepPresence makes the presence last ttl from when it was sent (never
	// shorter). A store that cannot keep one for its client (a Redis
	// Cluster) returns an error wrapping errors.ErrUnsupported.
	KeepPresence(ctx context.Context, ttl time.Duration) error
}

// ConfigChecker reads the server settings that can lose a lock without an
// error (Redis eviction, for one). A Locker calls it once, in the
// background, after its first acquisition.
type ConfigChecker interface {
	// CheckConfig returns one warning per unsafe setting, or an error
	// wrapping ErrConfigNotChecked when the server refuses the reads.
	CheckConfig(ctx context.Context) ([]ConfigWarning, error)
}

// ConfigWarning is a store setting that can lose a lock.
type ConfigWarning struct {
	Check     string // stable, snake_case: "redis_eviction"
	Seen, Fix string // what the server reported; the configuration that resolves it
}
