package leasehold

import (
	"context"
	"time"
)

// Semaphorer is implemented by stores that keep counting semaphores: at most
// Limit live permits per key, each permit a lease of its own with an owner
// token, a TTL and a fence.
//
// The rules every implementation follows (package storetest checks them with
// RunSemaphore):
//
//   - At most Limit live holders per key, counted by the store in the same
//     atomic step that grants. A holder whose TTL ran out is pruned inside
//     the next operation on the key: a crashed holder's permit comes back at
//     its TTL with no sweeper process.
//   - Every grant mints a fence that is unique and strictly greater than every
//     fence the store returned for the key before, across all permits, and
//     never goes backward, also after the store lost its data (the same
//     time-based floor as Store.Acquire).
//   - The waiter queue is the Store's rule widened to Limit: with F free
//     permits (Limit minus live holders), the first F live waiters of the
//     key's FIFO queue may take one; a token not in the queue is granted
//     only when fewer than F waiters are queued. A newcomer never overtakes a
//     live waiter. Queue entries live until QueueTTL after the waiter's last
//     AcquirePermit.
//   - Limit comes with every request. Lowering it never revokes a live
//     holder: new permits wait until the count is under the new limit.
//     Every user of a key should pass the same limit; the store remembers
//     the limit of the last grant (or a later request) for PermitInfo.
//   - ReleasePermit frees the permit and wakes, through PermitNotifier, only
//     the waiters whose turn came: the first F live waiters of the queue, F
//     the permits free afterwards under the limit the store saw last (none
//     while the count is at or over a lowered limit). A waiter among those F
//     that leaves passes its turn on the same way. With an empty queue a
//     freed permit wakes every subscriber of the key.
//
// The keys of a semaphore are a namespace of their own: a semaphore "k" and
// a mutex "k" do not exclude each other.
type Semaphorer interface {
	// AcquirePermit takes one permit of req.Key for req.Token in one round
	// trip when the rules above allow it, and returns its fence. If
	// req.Token already holds a permit (a retry after a lost reply) it
	// extends the TTL and returns the same fence.
	//
	// Otherwise it returns ErrNotAcquired and a Grant with what it saw: the
	// remaining TTL of the holder that expires first when every permit is
	// taken (0 when a permit is free but others wait ahead), that holder's
	// identity, and the number of live waiters ahead of req.Token. With
	// req.QueueTTL > 0 the token joins (or keeps) its place in the queue.
	AcquirePermit(ctx context.Context, req PermitRequest) (Grant, error)

	// RenewPermit extends token's permit of key to ttl from now, or returns
	// ErrNotOwned when token holds no live permit of key.
	RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error

	// ReleasePermit frees token's permit of key, removes token from the
	// key's queue and wakes the waiters. It returns nil when token held a
	// live permit and ErrNotHeld otherwise (it expired, or a retry of this
	// release already freed it); other holders are never touched.
	ReleasePermit(ctx context.Context, key, token string) error

	// Permits describes key's semaphore: its live holders (sorted by fence)
	// and queue. A semaphore nobody holds or waits for is a zero PermitInfo
	// with Key set, not an error.
	Permits(ctx context.Context, key string) (PermitInfo, error)
}

// PermitNotifier is implemented by semaphore stores that can wake a waiting
// token when a permit may have become free for it. Its contract is
// Notifier.WaitRelease's, for permits. A Locker without it polls.
type PermitNotifier interface {
	WaitPermit(ctx context.Context, key, token string) (wake <-chan struct{}, stop func(), err error)
}

// PermitRequest is one AcquirePermit attempt.
type PermitRequest struct {
	Key   string
	Token string
	TTL   time.Duration
	// Holder identifies the process (Options.Identity).
	Holder string
	// Limit is the number of permits of Key; it must be at least 1.
	Limit int
	// QueueTTL > 0 makes this a waiting acquire (see AcquireRequest).
	QueueTTL time.Duration
}

// PermitInfo describes a semaphore as the store sees it.
type PermitInfo struct {
	Key string `json:"key"`
	// Limit is the limit of the last grant or a later request (0 when
	// unknown).
	Limit int `json:"limit"`
	// Holders are the live permits, sorted by fence; each LockInfo's Waiting
	// and NextHolder are left zero (see below).
	Holders []LockInfo `json:"holders"`
	// Waiting is the number of live waiters, NextHolder the identity of the
	// one at the head.
	Waiting    int    `json:"waiting"`
	NextHolder string `json:"next_holder,omitempty"`
}
