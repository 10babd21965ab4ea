package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// DoOption configures one call of Locker.Do.
type DoOption func(*doOptions)

type doOptions struct {
	wait    time.Duration
	tryOnce bool
}

// WaitTimeout bounds how long Do waits for the key, separately from the
// work: fn's context is not bounded by it. d <= 0 means no bound beyond ctx.
func WaitTimeout(d time.Duration) DoOption { return func(o *doOptions) { o.wait = d } }

// TryOnce makes Do try the key once, as TryAcquire does, instead of waiting
// in the key's queue: "skip if busy". Do then returns an error matching
// ErrNotAcquired when another owner holds the key.
func TryOnce() DoOption { return func(o *doOptions) { o.tryOnce = true } }

// Do is the per-item pattern: it acquires key as Acquire does (or as
// TryAcquire does with TryOnce; WaitTimeout bounds the wait), runs fn with a
// context that is cancelled when ctx ends or the lease can no longer be
// trusted, and releases the lease when fn returns (also when it panics).
//
// Do returns fn's error, joined with the lease's cause when the lease was
// lost, abandoned or expired while fn ran (so errors.Is(err, ErrLeaseLost)
// works even when fn returned nil: its work may have overlapped another
// owner's), and with the release error if any. Errors are on one line and
// match every error they carry with errors.Is, as does the error of an
// acquisition that gave up (ErrNotAcquired and the context's error) or
// failed (ErrStore).
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error, opts ...DoOption) (err error) {
	lease, err := l.doAcquire(ctx, key, opts)
	if err != nil {
		return err
	}
	fnCtx, stop := lease.bind(ctx)
	defer func() {
		stop()
		cause := lease.Err()
		if errors.Is(cause, ErrLeaseReleased) || (err != nil && errors.Is(err, cause)) {
			cause = nil
		}
		rerr := lease.Release(ctx)
		err = joinErrors(err, cause, rerr)
	}()
	return fn(fnCtx, lease)
}

func (l *Locker) doAcquire(ctx context.Context, key string, opts []DoOption) (*Lease, error) {
	var o doOptions
	for _, opt := range opts {
		opt(&o)
	}
	wctx := ctx
	if o.wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, o.wait)
		defer cancel()
	}
	if o.tryOnce {
		return l.TryAcquire(wctx, key)
	}
	return l.Acquire(wctx, key)
}

// Loop runs a reconciler on the replica that holds key: every interval,
// while it holds a lease on key, it calls fn with a context that ends when
// ctx ends or ownership ends; while it does not, it tries (once) to take the
// key. The lease is renewed automatically, also while fn runs, so a slow fn
// keeps the key. Loop never gives up after losing the lease: it keeps
// contending until ctx ends, then releases and returns ctx's error. Errors
// from fn and from the store are logged and counted, not returned. interval
// must be at least MinRenewInterval and shorter than the TTL: it bounds how
// late a replica notices that it could take over.
func (l *Locker) Loop(ctx context.Context, key string, interval time.Duration, fn func(ctx context.Context, lease *Lease) error) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if interval < MinRenewInterval || interval >= l.opts.TTL {
		return fmt.Errorf("%w: loop interval (%v) must be at least %v and shorter than the TTL (%v)", ErrInvalidOptions, interval, MinRenewInterval, l.opts.TTL)
	}
	log := l.opts.Logger.With(slog.String("locker", l.opts.Name), slog.String("key", key), slog.String("holder", l.opts.Identity))
	var lease *Lease
	defer func() {
		if lease != nil {
			_ = lease.Release(context.WithoutCancel(ctx))
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		lease = l.loopLease(ctx, key, lease, log)
		if lease != nil && lease.Err() == nil {
			fnCtx, stop := lease.bind(ctx)
			if err := fn(fnCtx, lease); err != nil && ctx.Err() == nil {
				log.Warn("leasehold: loop function failed", slog.Uint64("fence", lease.Fence()), slog.Any("error", err))
			}
			stop()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// loopLease keeps a trusted lease, or drops an ended or degraded one and
// tries once to take key.
func (l *Locker) loopLease(ctx context.Context, key string, lease *Lease, log *slog.Logger) *Lease {
	if lease != nil && lease.Err() == nil && !lease.Degraded() {
		return lease
	}
	if lease != nil {
		_ = lease.Release(ctx)
	}
	lease, err := l.TryAcquire(ctx, key)
	if err != nil && !errors.Is(err, ErrNotAcquired) && ctx.Err() == nil {
		log.Warn("leasehold: loop could not acquire", slog.Any("error", err))
	}
	return lease
}
