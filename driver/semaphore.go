package driver

import (
	"context"
	"time"
)

// Semaphorer keeps counting semaphores: at most Limit live permits per key,
// each a lock of its own with a token, a TTL and a fence. The rules are the
// Store's, widened to Limit: the store counts live holders in the step that
// grants and prunes expired ones there; with F permits free, the first F live
// waiters may take one and a token not queued only when fewer than F wait.
// Fences are unique per key across permits. Lowering Limit revokes no
// holder. Semaphore keys are a namespace apart from lock keys.
type Semaphorer interface {
	// AcquirePermit is Store.Acquire for one permit. On ErrNotAcquired,
	// Grant.Remaining is the TTL of the holder that expires first when
	// every permit is taken.
	AcquirePermit(ctx context.Context, req PermitRequest) (Grant, error)
	// RenewPermit is Store.Renew for token's permit.
	RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error
	// ReleasePermit frees token's permit, removes token from the queue and
	// wakes the first F live waiters (every subscriber when none queues).
	// It returns ErrNotHeld when token held no live permit.
	ReleasePermit(ctx context.Context, key, token string) error
	// Permits describes key's semaphore; a zero PermitInfo with Key set when
	// nobody holds or waits.
	Permits(ctx context.Context, key string) (PermitInfo, error)
}

// PermitNotifier is Notifier for permits (no hand-offs: every Wake is zero).
type PermitNotifier interface {
	WaitPermit(ctx context.Context, key, token string) (wake <-chan Wake, stop func(), err error)
}

// PermitRequest is one AcquirePermit attempt.
type PermitRequest struct {
	Key, Token string
	TTL        time.Duration
	Holder     string
	Limit      int // >= 1; the store remembers the last for PermitInfo
	QueueTTL   time.Duration
}

// PermitInfo describes a semaphore as the store sees it.
type PermitInfo struct {
	Key        string     `json:"key"`
	Limit      int        `json:"limit"`   // of the last grant or later request; 0 unknown
	Holders    []LockInfo `json:"holders"` // live permits by fence; Waiting, NextHolder zero
	Waiting    int        `json:"waiting"`
	NextHolder string     `json:"next_holder,omitempty"`
}
