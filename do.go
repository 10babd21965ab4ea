package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// DoOptions configure one call of Locker.Do. The zero value waits in the
// key's queue, bounded by ctx only.
type DoOptions struct {
	WaitTimeout time.Duration // bounds the wait for the key, not fn; 0: no bound
	TryOnce     bool          // try the key once, as TryAcquire does
}

// Do acquires key as Acquire does, runs fn under the lease's context and
// releases the lease when fn returns or panics. Its error joins fn's error,
// the lease's cause if it ended while fn ran, and a failed release.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error, opts ...DoOptions) error {
	lease, err := l.doAcquire(ctx, key, opts)
	if err != nil {
		return err
	}
	return lease.run(ctx, fn)
}

// run is Do's and Semaphore.Do's body: it runs fn under the lease, then
// releases it, and joins fn's error, the lease's cause if it ended while fn
// ran, and a failed release.
func (ls *Lease) run(ctx context.Context, fn func(ctx context.Context, lease *Lease) error) (err error) {
	fnCtx, stop := ls.bind(ctx)
	defer func() {
		stop()
		cause := ls.Err()
		if errors.Is(cause, ErrLeaseReleased) || (err != nil && errors.Is(err, cause)) {
			cause = nil
		}
		rerr := ls.Release(ctx)
		err = joinErrors(err, cause, rerr)
	}()
	return fn(fnCtx, ls)
}

func (l *Locker) doAcquire(ctx context.Context, key string, opts []DoOptions) (*Lease, error) {
	var o DoOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("%w: Do takes at most one DoOptions, got %d", ErrInvalidOptions, len(opts))
	}
	wctx := ctx
	if o.WaitTimeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, o.WaitTimeout)
		defer cancel()
	}
	if o.TryOnce {
		return l.TryAcquire(wctx, key)
	}
	return l.Acquire(wctx, key)
}

// Loop runs fn every interval while this replica holds key, else tries once
// per interval to take it, until ctx ends or the Locker closes; then it
// releases and returns ctx's error, or ErrLockerClosed. fn's errors are
// logged. MinRenewInterval <= interval < TTL.
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
		case <-l.ctx.Done(): // nothing left to contend with
			return ErrLockerClosed
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
	if err != nil && !errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrLockerClosed) && ctx.Err() == nil {
		log.Warn("leasehold: loop could not acquire", slog.Any("error", err))
	}
	return lease
}
