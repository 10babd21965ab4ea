package drill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// errProcessDead is what a crashed replica's store calls return: nothing
// reaches the store any more.
var errProcessDead = errors.New("drill: replica process is dead")

// procStore is one replica process's view of the shared store. It records
// every call's effect on the lock's lifetime and simulates the process's
// faults: frozen (a pause: calls wait, as if the process were stopped, until
// it thaws or the call's context ends, and nothing reaches the store
// meanwhile) and dead (a crash: every call fails without reaching the store).
// It forwards every optional capability of the store it wraps, so the drill
// exercises what a Locker does in production (batched renewal, release
// notifications, semaphores) and what the CLI does (inspect, force release).
type procStore struct {
	inner fullStore
	h     host // where the calls are recorded
	// applied reports whether a failed call may nevertheless have been
	// applied by the store (a lost reply).
	applied func(error) bool
	// late bounds how long after its return a failed call may still be
	// applied.
	late time.Duration

	mu     sync.Mutex
	frozen chan struct{} // non-nil while paused; closed on thaw
	dead   bool
}

var _ fullStore = (*procStore)(nil)

// fullStore is a store with every optional capability. Every store in this
// repository has them all; newProcStore refuses one that lacks any rather
// than hide or fake it.
type fullStore interface {
	driver.Store
	driver.Inspector
	driver.Notifier
	driver.BatchRenewer
	driver.ForceReleaser
	driver.Semaphorer
	driver.PermitNotifier
}

// newProcStore wraps st for one replica process; it fails when st lacks an
// optional capability.
func newProcStore(st driver.Store, h host, applied func(error) bool, late time.Duration) (*procStore, error) {
	full, ok := st.(fullStore)
	if !ok {
		return nil, fmt.Errorf("%w: the drill needs a store with every optional capability (Inspector, Notifier, "+
			"BatchRenewer, ForceReleaser, Semaphorer, PermitNotifier); %T lacks one", ErrSetup, st)
	}
	return &procStore{inner: full, h: h, applied: applied, late: late}, nil
}

func (p *procStore) freeze() {
	p.mu.Lock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
	p.mu.Unlock()
}

func (p *procStore) thaw() {
	p.mu.Lock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
	p.mu.Unlock()
}

func (p *procStore) kill() {
	p.mu.Lock()
	p.dead = true
	p.mu.Unlock()
}

func (p *procStore) state() (frozen chan struct{}, dead bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen, p.dead
}

// gate blocks while the process is frozen and fails when it is dead.
func (p *procStore) gate(ctx context.Context) error {
	frozen, dead := p.state()
	if frozen != nil && !dead {
		select {
		case <-frozen:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, dead = p.state()
	}
	if dead {
		return errProcessDead
	}
	return nil
}

// gated runs f once the gate lets the call through.
func gated[T any](ctx context.Context, p *procStore, f func() (T, error)) (T, error) {
	if err := p.gate(ctx); err != nil {
		var zero T
		return zero, err
	}
	return f()
}

// tracked runs a store call for token through the gate and records it:
// extends says whether it extends the lock's lifetime (acquire, renew) when
// it is applied; a grant is recorded as an acquisition of key.
func tracked[T any](ctx context.Context, p *procStore, key, token string, extends bool,
	f func() (T, error)) (T, error) {
	return gated(ctx, p, func() (T, error) {
		call := p.begin(token)
		v, err := f()
		p.end(key, token, call, err, extends)
		if g, ok := any(v).(driver.Grant); ok && err == nil {
			p.h.call(wire{K: "acq", Key: key, Token: token, Fence: g.Fence, Call: call, At: p.h.since()})
		}
		return v, err
	})
}

// begin records that a call for token is sent now and returns the time.
func (p *procStore) begin(token string) time.Duration {
	call := p.h.since()
	p.h.call(wire{K: "begin", Token: token, At: call})
	return call
}

// end records a call's return: an acquire or renew is applied when it
// succeeded, maybe applied (up to p.late after its return) when it failed
// without an answer. A release that reached the store, or may have, is
// flagged with its key: a store that hands the key to the head of its
// queue on release starts the head's lock then, with no call of the head's
// token.
func (p *procStore) end(key, token string, call time.Duration, err error, extends bool) {
	m := wire{K: "ret", Token: token, Call: call}
	switch {
	case extends && err == nil:
		m.OK = true
	case extends && p.applied(err):
		m.OK, m.Late = true, p.late
	case !extends && (err == nil || errors.Is(err, leasehold.ErrNotOwned) || errors.Is(err, leasehold.ErrNotHeld)):
		m.Key, m.Flag = key, true
	case !extends && p.applied(err):
		m.Key, m.Flag, m.Late = key, true, p.late
	}
	m.At = p.h.since()
	p.h.call(m)
}

// trackedErr is tracked for a call that returns only an error.
func (p *procStore) trackedErr(ctx context.Context, key, token string, extends bool, f func() error) error {
	_, err := tracked(ctx, p, key, token, extends, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

func (p *procStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := tracked(ctx, p, req.Key, req.Token, true, func() (driver.Grant, error) {
		return p.inner.Acquire(ctx, req)
	})
	if _, present := p.inner.(driver.PresenceKeeper); present && err != nil {
		// An acquire that finds the key free with a place kept by a
		// presence at the head hands the key to that head, with no call of
		// the head's token, as a release does.
		switch {
		case errors.Is(err, leasehold.ErrNotAcquired):
			p.h.call(wire{K: "handoff", Key: req.Key, At: p.h.since()})
		case p.applied(err):
			p.h.call(wire{K: "handoff", Key: req.Key, At: p.h.since(), Late: p.late})
		}
	}
	return g, err
}

func (p *procStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	return p.trackedErr(ctx, key, token, true, func() error { return p.inner.Renew(ctx, key, token, ttl) })
}

func (p *procStore) Release(ctx context.Context, key, token string) error {
	return p.trackedErr(ctx, key, token, false, func() error { return p.inner.Release(ctx, key, token) })
}

// AcquirePermit, RenewPermit and ReleasePermit are recorded as Acquire,
// Renew and Release are (the semaphore workload).
func (p *procStore) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	return tracked(ctx, p, req.Key, req.Token, true, func() (driver.Grant, error) {
		return p.inner.AcquirePermit(ctx, req)
	})
}

func (p *procStore) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	return p.trackedErr(ctx, key, token, true, func() error { return p.inner.RenewPermit(ctx, key, token, ttl) })
}

func (p *procStore) ReleasePermit(ctx context.Context, key, token string) error {
	return p.trackedErr(ctx, key, token, false, func() error { return p.inner.ReleasePermit(ctx, key, token) })
}

// RenewBatch renews in one round trip, recording each renewal as Renew does.
func (p *procStore) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	if err := p.gate(ctx); err != nil {
		return fill(len(reqs), err)
	}
	calls := make([]time.Duration, len(reqs))
	for i, r := range reqs {
		calls[i] = p.begin(r.Token)
	}
	errs := p.inner.RenewBatch(ctx, reqs)
	for i, r := range reqs {
		p.end(r.Key, r.Token, calls[i], errs[i], true)
	}
	return errs
}

// refreshingStore is a procStore over a store that also keeps waiters'
// queue places in batches (driver.QueueRefresher), which it forwards, so
// that the drill's waiters keep their places as a Locker's do in production.
type refreshingStore struct {
	*procStore
	rq driver.QueueRefresher
}

// presentStore is a refreshingStore over a driver.PresenceKeeper, which it
// forwards, so that the drill's waiters keep their places by their
// process's presence as a Locker's do in production.
type presentStore struct {
	refreshingStore
	pk driver.PresenceKeeper
}

// forLocker returns what the replica's Locker runs on: p, with RefreshQueue
// and KeepPresence when the store it wraps has them (not every store does).
func (p *procStore) forLocker() driver.Store {
	rq, ok := p.inner.(driver.QueueRefresher)
	if !ok {
		return p
	}
	if pk, ok := p.inner.(driver.PresenceKeeper); ok {
		return presentStore{refreshingStore{p, rq}, pk}
	}
	return refreshingStore{p, rq}
}

// KeepPresence keeps the replica's presence: it only passes the gate.
func (r presentStore) KeepPresence(ctx context.Context, ttl time.Duration) error {
	if err := r.gate(ctx); err != nil {
		return err
	}
	return r.pk.KeepPresence(ctx, ttl)
}

// RefreshQueue keeps queue places without changing a lock: it only passes
// the gate.
func (r refreshingStore) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	if err := r.gate(ctx); err != nil {
		return fill(len(reqs), err)
	}
	return r.rq.RefreshQueue(ctx, reqs)
}

// fill returns n copies of err: the answer of a batch that failed whole.
func fill(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// The calls that do not change a lock only pass the gate.

func (p *procStore) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	return gated(ctx, p, func() (driver.PermitInfo, error) { return p.inner.Permits(ctx, key) })
}

func (p *procStore) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := p.gate(ctx); err != nil {
		return nil, nil, err
	}
	return p.inner.WaitPermit(ctx, key, token)
}

func (p *procStore) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	return gated(ctx, p, func() (driver.LockInfo, error) { return p.inner.Inspect(ctx, key) })
}

func (p *procStore) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	return gated(ctx, p, func() ([]driver.LockInfo, error) { return p.inner.List(ctx, prefix) })
}

func (p *procStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := p.gate(ctx); err != nil {
		return nil, nil, err
	}
	ch, stop, err := p.inner.WaitRelease(ctx, key, token)
	if err != nil {
		return nil, nil, err
	}
	out, stopOut := plainWakes(ch, stop)
	return out, stopOut, nil
}

// plainWakes passes ch's wake-ups on without their hand-offs: the history
// records every acquisition as a call of its token, so the drill's Lockers
// take no lease from a wake-up and acquire instead. stop also ends the
// forwarding goroutine and waits for it.
func plainWakes(ch <-chan driver.Wake, stop func()) (<-chan driver.Wake, func()) {
	out := make(chan driver.Wake, 1)
	select {
	case <-ch: // the wake-up at once, still there when WaitRelease returns
		out <- driver.Wake{}
	default:
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ch:
				select {
				case out <- driver.Wake{}:
				default:
				}
			case <-done:
				return
			}
		}
	})
	var once sync.Once
	return out, func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			stop()
		})
	}
}

func (p *procStore) ForceRelease(ctx context.Context, key string) (driver.LockInfo, error) {
	return gated(ctx, p, func() (driver.LockInfo, error) { return p.inner.ForceRelease(ctx, key) })
}

func (p *procStore) paused() (frozen, gone <-chan struct{}) {
	f, _ := p.state()
	return f, nil
}
