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

// Leader is who holds an election's key; the zero Leader: vacant.
type Leader struct {
	Holder    string        `json:"holder"`       // its Options.Identity
	Fence     uint64        `json:"fence"`        // greater for every later leader
	Remaining time.Duration `json:"remaining_ns"` // as the store reported it
}

// Vacant reports whether nobody leads.
func (ld Leader) Vacant() bool { return ld.Fence == 0 && ld.Holder == "" }

// Callbacks are an Election's optional hooks, called from goroutines Run joins
// before it returns.
type Callbacks struct {
	OnStartedLeading func(ctx context.Context, lease *Lease) // while leading; return once ctx is done
	OnStoppedLeading func(cause error)                       // after OnStartedLeading returned
	OnNewLeader      func(leader Leader)                     // every new leader observed, in order
}

// Election is a leader election on one key, safe for concurrent use:
// leadership is a lease and passes in campaign order.
type Election struct {
	l   *Locker
	key string
	cb  Callbacks

	mu    sync.Mutex
	lease *Lease // this participant's leadership, while it leads
}

// NewElection returns an election on key (the store: a driver.Inspector).
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

// Campaign waits in the key's queue until this participant leads or ctx ends,
// and returns the leader's lease (the same one while it leads). A store
// failure is an error, also under FailOpen.
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

// Resign releases the leader's lease, so the next candidate takes over at
// once; nil when this participant does not lead.
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

// Leader asks the store who leads; the zero Leader when vacant.
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
// the current one, until ctx ends or the Locker closes (it closes the
// channel, before Close returns); a very short term can go unseen.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	l := e.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		close(ch)
		return ch
	}
	l.bg.Add(1) // Close joins it
	go func() {
		defer l.bg.Done()
		octx, cancel := context.WithCancel(ctx) // a store call in flight ends with the Locker too
		defer cancel()
		defer context.AfterFunc(l.ctx, cancel)()
		e.observe(octx, ch)
	}()
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

// Run campaigns and leads (OnStartedLeading, then OnStoppedLeading) again and
// again until ctx ends, then resigns and returns ctx's error. It returns a
// store error only when it wraps ErrMisconfigured.
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
