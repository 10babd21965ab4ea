package leasehold

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// Semaphore hands out at most Limit permits of one key across processes (FIFO
// queue in the store), each a *Lease with its own fence. It is safe for
// concurrent use. A FailOpen permit counts against no limit.
type Semaphore struct {
	l      *Locker
	key    string
	store  driver.Semaphorer
	notify driver.PermitNotifier // nil when the store cannot notify
	limit  atomic.Int64
}

// Semaphore returns key's semaphore with limit permits, without a store call.
// The store must implement driver.Semaphorer; limit >= 1.
func (l *Locker) Semaphore(key string, limit int) (*Semaphore, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	st, ok := l.store.(driver.Semaphorer)
	if !ok {
		return nil, fmt.Errorf("%w: store %T does not implement driver.Semaphorer", ErrInvalidOptions, l.store)
	}
	s := &Semaphore{l: l, key: key, store: st}
	s.notify, _ = l.store.(driver.PermitNotifier)
	if err := s.SetLimit(limit); err != nil {
		return nil, err
	}
	return s, nil
}

// Key returns the semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// Limit returns the current limit.
func (s *Semaphore) Limit() int { return int(s.limit.Load()) }

// SetLimit changes the limit of later and waiting acquisitions through s;
// lowering it revokes no permit.
func (s *Semaphore) SetLimit(limit int) error {
	if limit < 1 {
		return fmt.Errorf("%w: semaphore limit must be at least 1, got %d", ErrInvalidOptions, limit)
	}
	s.limit.Store(int64(limit))
	return nil
}

// TryAcquire makes one attempt to take a permit, as Locker.TryAcquire.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) {
	return s.l.acquire(ctx, leaseSpec{key: s.key, ttl: s.l.opts.TTL, kind: renewed, ops: permitOps{s: s}})
}

// Acquire waits in the key's queue for a permit, as Locker.Acquire.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	w := &permitWait{}
	lease, err := s.l.acquire(ctx, leaseSpec{key: s.key, ttl: s.l.opts.TTL, kind: renewed, wait: true, ops: permitOps{s: s, w: w}})
	if w.queued {
		e := Event{Kind: EventPermitWaitEnded, Key: s.key, Result: ResultAcquired, Duration: time.Since(w.start), Permit: true}
		switch {
		case lease != nil:
			e.Fence = lease.Fence()
		case errors.Is(err, ErrNotAcquired):
			e.Result = ResultContended
		default:
			e.Result, e.Err = ResultError, err
		}
		s.l.observe(e)
	}
	return lease, err
}

// permitWait is one waiting acquisition's state: whether it joined the
// queue (EventPermitWaiting was reported). Only the acquisition's own
// goroutine touches it.
type permitWait struct {
	queued bool
	start  time.Time
}

// Do runs fn under a permit, as Locker.Do.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context, permit *Lease) error) error {
	permit, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	return permit.run(ctx, fn)
}

// Permits describes the semaphore as the store sees it.
func (s *Semaphore) Permits(ctx context.Context) (driver.PermitInfo, error) {
	info, err := s.store.Permits(ctx, s.key)
	if err != nil {
		return driver.PermitInfo{}, storeErr("permits", s.key, err)
	}
	return info, nil
}

// permitOps are a semaphore's permit operations; w is set for a waiting
// acquisition (Acquire).
type permitOps struct {
	s *Semaphore
	w *permitWait
}

func (o permitOps) acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := o.s.store.AcquirePermit(ctx, driver.PermitRequest{
		Key: req.Key, Token: req.Token, TTL: req.TTL, Holder: req.Holder, QueueTTL: req.QueueTTL, Limit: o.s.Limit(),
	})
	if o.w != nil && !o.w.queued && req.QueueTTL > 0 && errors.Is(err, ErrNotAcquired) {
		o.w.queued, o.w.start = true, time.Now()
		o.s.l.observe(Event{Kind: EventPermitWaiting, Key: req.Key, Permit: true})
	}
	return g, err
}

func (o permitOps) renew(ctx context.Context, key, token string, ttl time.Duration) error {
	return o.s.store.RenewPermit(ctx, key, token, ttl)
}

func (o permitOps) release(ctx context.Context, key, token string) error {
	return o.s.store.ReleasePermit(ctx, key, token)
}

func (o permitOps) canWait() bool { return o.s.notify != nil }

func (o permitOps) wait(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	return o.s.notify.WaitPermit(ctx, key, token)
}

func (permitOps) gated() bool     { return false }
func (permitOps) batchable() bool { return false }
func (permitOps) permit() bool    { return true }
