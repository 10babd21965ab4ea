package leasehold

import (
	"context"
	"time"
)

// Store is what a Locker calls: acquire with a fence, renew and release, each
// one round trip and token-checked on the server. Implementations live in
// sub-packages (memstore, redisstore, etcdstore, pgstore) and must pass the
// conformance suite in package storetest against the real server.
//
// Optional capabilities are separate interfaces beside Store: Inspector,
// Notifier (and Granter beside it), BatchRenewer and ForceReleaser. A
// wrapper around a Store (a fault injector, an instrumenting proxy) must
// forward every capability it does not mean to hide.
//
// Every method is safe for concurrent use. A method that cannot reach the
// store, or that gets no answer before ctx ends, returns an error that is not
// ErrNotAcquired, ErrNotOwned or ErrNotHeld: those three mean the store
// answered. The Locker wraps the others in a *StoreError.
//
// # The waiter queue
//
// Every key has a FIFO queue of waiting tokens, kept in the store so that it
// spans processes. An entry lives until its queue deadline (QueueTTL after
// the waiter's last Acquire); expired entries are dropped before any decision.
// The rule for every acquire, waiting or not: the key is granted only when it
// is free and the queue is empty or req.Token is at its head. A newcomer never
// overtakes a live waiter.
type Store interface {
	// Acquire atomically takes req.Key for req.Token for req.TTL when the
	// queue rule above allows it, in one round trip, and returns a fence that
	// is strictly greater than every fence this store ever returned for the
	// key. The grant removes req.Token from the queue and records req.Holder
	// with the lock.
	//
	// If the key is already held by req.Token (a retry after a lost reply)
	// Acquire succeeds, extends the TTL and returns the same fence.
	//
	// Otherwise it returns ErrNotAcquired and a Grant describing what it saw:
	// the holder's remaining TTL (0 when the key is free but others wait
	// ahead), the holder's identity, and the number of waiters ahead. With
	// req.QueueTTL > 0 the token is also appended to the queue (if absent) and
	// its queue deadline refreshed; with QueueTTL == 0 (TryAcquire, Hold) it
	// never queues.
	Acquire(ctx context.Context, req AcquireRequest) (Grant, error)

	// Renew extends the TTL of key to ttl from now if and only if token owns
	// it, and returns ErrNotOwned otherwise. Renewing twice is harmless.
	Renew(ctx context.Context, key, token string, ttl time.Duration) error

	// Release deletes key if and only if token owns it and wakes the head of
	// the key's waiter queue (only the head, where the store can address
	// it). It also removes token from the queue, so a waiter that gives up
	// calls Release to leave; when that makes a new head of a free key, the
	// new head is woken.
	//
	// It returns nil when token owned the key, ErrNotOwned when another token
	// holds it (that lock is left alone), and ErrNotHeld when nobody holds it
	// (it expired, or a retry of this very release already deleted it).
	Release(ctx context.Context, key, token string) error
}

// AcquireRequest is one acquire attempt.
type AcquireRequest struct {
	Key   string
	Token string
	TTL   time.Duration
	// Holder identifies the process that holds the lock (Options.Identity):
	// stored with the lock and shown by Inspect, List and `leasehold ls`.
	Holder string
	// QueueTTL > 0 makes this a waiting acquire: on contention the token
	// joins (or keeps) its place in the key's FIFO queue until QueueTTL from
	// now. Zero never queues.
	QueueTTL time.Duration
}

// Grant is what Store.Acquire reports.
type Grant struct {
	// Fence is the fence token of the acquisition (on success).
	Fence uint64
	// Remaining is the holder's remaining TTL as the store reports it, when
	// Acquire returned ErrNotAcquired; 0 when the key is free (others wait
	// ahead) or the store cannot tell. It counts from when the request was
	// sent, or from a later moment (Redis and PostgreSQL: when the server ran
	// it): a waiter next in line retries at its send time + Remaining, never
	// after the lock may be taken.
	Remaining time.Duration
	// Holder is the current holder's identity on ErrNotAcquired, if known.
	Holder string
	// Ahead is the number of live waiters ahead of the token on
	// ErrNotAcquired (the whole queue for a token that did not queue).
	Ahead int
}

// Inspector is implemented by stores that can describe their locks, for
// `leasehold inspect` and `leasehold ls`.
type Inspector interface {
	// Inspect returns the current lock on key, or ErrNotHeld.
	Inspect(ctx context.Context, key string) (LockInfo, error)

	// List returns the locks whose key starts with prefix, sorted by key.
	// Entries the store cannot decode are skipped and reported in the
	// returned error (which then wraps ErrBadEntry) along with the good
	// entries, so one corrupt entry never hides the others.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Notifier is implemented by stores that can tell a waiter when it may take
// a key (Redis pub/sub, etcd watch, PostgreSQL LISTEN, an in-process
// channel). A Locker uses it when the store has it; polling is only a safety
// net.
type Notifier interface {
	// WaitRelease subscribes token's wake-ups for key. The returned channel
	// receives a value (it is never closed) when key was released or its
	// queue head left and token may now be at the head, and after every
	// reconnect of the notification path (a wake-up may have been missed:
	// every waiter re-checks). Stores that cannot address one waiter may wake
	// every waiter of the key. stop ends the subscription and must be called
	// exactly once. Subscribe before trying to acquire, so a release between
	// the try and the wait is not missed. Waiting for the subscription itself
	// is bounded by ctx.
	//
	// An empty token subscribes an observer (an election's follower, `leasehold
	// leader --watch`): it is woken on every release of key and every change
	// of its queue head, whoever the head is.
	WaitRelease(ctx context.Context, key, token string) (wake <-chan struct{}, stop func(), err error)
}

// Granter is implemented by Notifiers whose Release hands a free key straight
// to the head of its queue, in the same round trip, and tells that waiter
// through its WaitRelease subscription (Redis: release.lua grants and
// publishes "TOKEN|FENCE|TTL_MS"). A waiter woken with a grant takes the
// lease without an acquire request of its own. A store can implement it
// where its release can write the head's lock atomically and address the
// head: etcd in the release transaction (put the head's lock key under the
// head's lease, a watch event carries it), PostgreSQL in the release
// statement (update the row to the head, NOTIFY with the grant as payload).
//
// The store grants what the head asked for in its last waiting Acquire (the
// token, its Holder and TTL) with a fresh fence by the Acquire rules, and
// removes the head from the queue. The lock's expiry is at least
// min(TTL, QueueTTL) after the moment that Acquire was sent: the grant is
// capped at the waiter's queue deadline, so a waiter that died holds the key
// no longer than its place in the queue would have. A waiter that missed
// the grant, or no longer trusts it, finds itself the holder on its next
// Acquire (which then returns the same fence and extends the TTL); one that
// gives up calls Release with its token, which frees a grant it may have
// received.
type Granter interface {
	// Granted returns, and forgets, the grant a release made to token for key
	// while token's WaitRelease subscription was open. ok is false when no
	// grant arrived. Call it after a wake-up, before sending Acquire.
	Granted(key, token string) (h Handoff, ok bool)

	// Live reports whether key's notifications are already subscribed in this
	// process (another waiter, or a recent one, keeps them), so that
	// WaitRelease would return without a store round trip. A waiter then
	// subscribes before its first Acquire, and needs no second Acquire to
	// catch a release that came before its subscription.
	Live(key string) bool
}

// Resumer is implemented by Notifiers whose WaitRelease, called after a
// waiting Acquire of the same key and token, misses no change since that
// Acquire's answer: the subscription starts from what that answer saw (etcd:
// the watch starts at the answer's revision) and wakes the waiter at once
// when the key may already be its to take. A waiter that subscribes after its
// first queued Acquire then goes straight to waiting, without a second
// Acquire to catch a release that came between the two.
type Resumer interface {
	// Resumes reports whether WaitRelease for key and token picks up from
	// token's last waiting Acquire of key.
	Resumes(key, token string) bool
}

// Handoff is a grant a release made to a waiter (see Granter).
type Handoff struct {
	Fence uint64
	// TTL is the lock TTL the grant was made for: the one in the waiter's
	// last waiting Acquire, at the store's precision.
	TTL time.Duration
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
// for renewal at about the same time renews them together.
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

// LockInfo describes a lock as the store sees it.
type LockInfo struct {
	Key       string        `json:"key"`
	Token     string        `json:"token"`
	Holder    string        `json:"holder,omitempty"` // the holder's identity (Options.Identity)
	Fence     uint64        `json:"fence"`
	Remaining time.Duration `json:"remaining_ns"`
	// Waiting is the number of live waiters queued for the key, and
	// NextHolder the identity of the one at the head.
	Waiting    int               `json:"waiting"`
	NextHolder string            `json:"next_holder,omitempty"`
	Facts      map[string]string `json:"facts,omitempty"` // store-specific facts, e.g. the Redis key names
}
