package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// Leader describes who holds an election's key. The zero Leader means the
// key is vacant.
type Leader struct {
	// Holder is the leader's identity (its Locker's Options.Identity).
	Holder string `json:"holder"`
	// Fence is the fence of the leader's lease: a later leader always has a
	// greater one, so the leader's writes can be fenced (package fence).
	Fence uint64 `json:"fence"`
	// Remaining is the leader's remaining TTL as the store reported it.
	Remaining time.Duration `json:"remaining_ns"`
}

// Vacant reports whether nobody leads.
func (ld Leader) Vacant() bool { return ld.Fence == 0 && ld.Holder == "" }

// Callbacks are an Election's hooks, each optional. They are called from
// goroutines the Election owns and joins before Run returns.
type Callbacks struct {
	// OnStartedLeading runs in its own goroutine when this participant
	// becomes leader. Its ctx ends the moment leadership can no longer be
	// trusted, with the lease's cause (context.Cause: ErrLeaseLost,
	// ErrLeaseAbandoned, ErrLeaseExpired, ErrMaxHoldReached,
	// ErrLeaseReleased, ErrLockerClosed), or when Run's ctx ends. Run waits
	// for it to return before it resigns and campaigns again, so it must
	// return promptly once ctx is done.
	OnStartedLeading func(ctx context.Context, lease *Lease)
	// OnStoppedLeading is called after OnStartedLeading returned and the
	// lease ended, with the cause.
	OnStoppedLeading func(cause error)
	// OnNewLeader is called for every new leader this participant observes,
	// in order, itself included; vacancies between leaders are not reported.
	OnNewLeader func(leader Leader)
}

// Election is a leader election on one key of a Locker's store: the
// per-loop TTL hold of a reconciler or a snapshot writer, with callbacks.
// Leadership is a lease: it carries a fence, is renewed automatically with
// the Locker's failure budget, and ends with the same causes. Candidates
// queue in the store's FIFO queue, so leadership passes in campaign order.
//
// An Election is safe for concurrent use. Use one per participant and key;
// several Elections may share a Locker, on different keys.
//
// What is not guaranteed: leadership is only as exclusive as the lease. A
// leader paused past its TTL (GC, SIGSTOP) can act after another leader took
// over; only storage that checks the fence rejects its writes. Under FailOpen
// a store failure never makes anyone leader: Campaign returns the error.
type Election struct {
	l   *Locker
	key string
	cb  Callbacks

	mu    sync.Mutex
	lease *Lease // this participant's leadership, while it leads
}

// NewElection returns an election on key. The Locker's store must implement
// Inspector (every store of this module does), so that Leader and Observe can
// tell who leads.
func NewElection(l *Locker, key string, cb Callbacks) (*Election, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: election needs a Locker, got nil", ErrInvalidOptions)
	}
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if _, ok := l.store.(driver.Inspector); !ok {
		return nil, fmt.Errorf("%w: election needs a store that implements driver.Inspector, %T does not", ErrInvalidOptions, l.store)
	}
	return &Election{l: l, key: key, cb: cb}, nil
}

// Key returns the election's key.
func (e *Election) Key() string { return e.key }

// Campaign waits in the key's queue until this participant leads or ctx
// ends, and returns the leader's lease: renewed automatically, its Context
// ends when leadership can no longer be trusted. While this participant
// already leads, Campaign returns the same lease. A store failure is
// returned as an error, also under FailOpen: a degraded lease is not
// leadership.
func (e *Election) Campaign(ctx context.Context) (*Lease, error) {
	e.mu.Lock()
	if e.lease != nil && e.lease.Err() == nil {
		lease := e.lease
		e.mu.Unlock()
		return lease, nil
	}
	e.mu.Unlock()
	lease, err := e.l.Acquire(ctx, e.key)
	if err != nil {
		return nil, err
	}
	if lease.Degraded() {
		_ = lease.Release(ctx)
		return nil, &StoreError{Op: "acquire", Key: e.key, Err: errors.New("the store failed; a fail-open lease is not leadership")}
	}
	e.mu.Lock()
	e.lease = lease
	e.mu.Unlock()
	return lease, nil
}

// Resign gives up leadership: it releases the leader's lease (token-checked),
// so the next candidate in the queue takes over at once. It is a no-op
// returning nil when this participant does not lead.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	lease := e.lease
	e.lease = nil
	e.mu.Unlock()
	if lease == nil {
		return nil
	}
	return lease.Release(ctx)
}

// Leader asks the store who leads now. A vacant key is the zero Leader and
// no error; a store failure is a *StoreError.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	info, err := e.l.store.(driver.Inspector).Inspect(ctx, e.key)
	switch {
	case errors.Is(err, ErrNotHeld):
		return Leader{}, nil
	case err != nil:
		return Leader{}, storeErr("inspect", e.key, err)
	}
	return Leader{Holder: info.Holder, Fence: info.Fence, Remaining: info.Remaining}, nil
}

// Observe reports every change of leader, vacancies included, starting with
// the current state. It is woken by the store's release notifications, by a
// timer at the leader's remaining TTL (a leader that crashed never
// releases), and polls only as a safety net (Options.WaitCap) and while
// the key is vacant (1 ms after the first look, doubling up to WaitCap).
// Nothing notifies an acquisition, so a term that begins and ends between
// two looks can go unseen: one shorter than a notification plus an Inspect
// round trip, or, for a leader that took over a crashed one's key, shorter
// than the vacancy poll's interval by then. The fence of every leader it
// does report is greater than the one before. Store failures are retried,
// not reported. The
// channel is closed when ctx ends or the Locker closes, and the goroutine
// behind it has then returned.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	go e.observe(ctx, ch)
	return ch
}

// observer is the state of one Observe loop.
type observer struct {
	e       *Election
	last    Leader
	sent    bool
	backoff time.Duration
}

func (e *Election) observe(ctx context.Context, ch chan<- Leader) {
	defer close(ch)
	var wake <-chan driver.Wake
	if n, ok := e.l.store.(driver.Notifier); ok {
		if w, stop, err := n.WaitRelease(ctx, e.key, ""); err == nil {
			wake = w
			defer stop()
		}
	}
	o := &observer{e: e, backoff: time.Millisecond}
	for {
		wait, ok := o.step(ctx, ch)
		if !ok {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		case <-e.l.ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil || e.l.ctx.Err() != nil {
			return
		}
	}
}

// step looks at the leader once, reports a change, and returns how long to
// wait before the next look; false when ctx ended while reporting.
func (o *observer) step(ctx context.Context, ch chan<- Leader) (time.Duration, bool) {
	capWait := o.e.l.opts.WaitCap
	cur, err := o.e.Leader(ctx)
	if err != nil {
		return capWait, true
	}
	if !o.sent || cur.Holder != o.last.Holder || cur.Fence != o.last.Fence {
		select {
		case ch <- cur:
		case <-ctx.Done():
			return 0, false
		case <-o.e.l.ctx.Done():
			return 0, false
		}
		o.last, o.sent = cur, true
	}
	if cur.Vacant() {
		// A new leader usually takes the key within a round trip or two of
		// a release or an expiry, and nothing notifies an acquisition.
		wait := min(o.backoff, capWait)
		o.backoff = min(2*o.backoff, capWait)
		return wait, true
	}
	o.backoff = time.Millisecond
	if cur.Remaining > 0 {
		return min(capWait, cur.Remaining+time.Millisecond), true
	}
	return capWait, true
}

// Run takes part in the election until ctx ends: it campaigns, calls
// OnStartedLeading while it leads, resigns when leadership ends, calls
// OnStoppedLeading, and campaigns again. It never gives up after losing
// leadership; store failures are logged and retried every WaitCap, except a
// misconfigured store, which retrying cannot fix: Run returns its error
// (wrapping ErrMisconfigured) when a campaign fails with one. When ctx ends
// it resigns (so another candidate takes over at once), waits for every
// callback, and returns ctx's error; it returns ErrLockerClosed when the
// Locker closes.
func (e *Election) Run(ctx context.Context) error {
	if e.cb.OnNewLeader != nil {
		octx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ld := range e.Observe(octx) {
				if !ld.Vacant() {
					e.cb.OnNewLeader(ld)
				}
			}
		}()
		defer func() { stop(); wg.Wait() }()
	}
	for {
		lease, err := e.Campaign(ctx)
		switch {
		case ctx.Err() != nil:
			if lease != nil {
				// Campaign won as ctx ended: hand the key on.
				_ = e.Resign(context.WithoutCancel(ctx))
			}
			return ctx.Err()
		case errors.Is(err, ErrLockerClosed), errors.Is(err, ErrMisconfigured):
			return err
		case err != nil:
			e.l.opts.Logger.WarnContext(ctx, "leasehold: election campaign failed", slog.String("locker", e.l.opts.Name),
				slog.String("key", e.key), slog.Any("error", err))
			if !sleepCtx(ctx, e.l.ctx, e.l.opts.WaitCap) {
				return e.stopErr(ctx)
			}
			continue
		}
		e.lead(ctx, lease)
		if ctx.Err() != nil || e.l.ctx.Err() != nil {
			return e.stopErr(ctx)
		}
	}
}

// lead runs OnStartedLeading for one term of leadership and ends the term.
func (e *Election) lead(ctx context.Context, lease *Lease) {
	lctx, stop := lease.bind(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if e.cb.OnStartedLeading != nil {
			e.cb.OnStartedLeading(lctx, lease)
		}
	}()
	<-lctx.Done()
	<-done
	cause := lease.Err()
	if cause == nil {
		cause = context.Cause(lctx)
	}
	_ = e.Resign(context.WithoutCancel(ctx))
	if e.cb.OnStoppedLeading != nil {
		e.cb.OnStoppedLeading(cause)
	}
}

func (e *Election) stopErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return ErrLockerClosed
}

// sleepCtx sleeps for d; false when ctx or closing ended first.
func sleepCtx(ctx, closing context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-closing.Done():
		return false
	}
}
