package drill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
)

// errProcessDead is what a crashed replica's store calls return: nothing
// reaches the store any more.
var errProcessDead = errors.New("drill: replica process is dead")

// procStore is one replica process's view of the shared store. It records
// every call's effect on the lock's lifetime and simulates the process's
// faults: frozen (a pause: calls wait, as if the process were stopped, until
// it thaws or the call's context ends, and nothing reaches the store
// meanwhile) and dead (a crash: every call fails without reaching the store).
type procStore struct {
	inner   fullStore
	rec     callRecorder
	replica int
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

// procStore forwards every optional capability of the stores it wraps, so
// the drill exercises what a Locker does in production (batched renewal,
// release notifications) and what the CLI does (inspect, force release).
// Every store in this repository has all four; newProcStore refuses one that
// lacks any rather than hide or fake it.
var (
	_ leasehold.Store          = (*procStore)(nil)
	_ leasehold.Inspector      = (*procStore)(nil)
	_ leasehold.Notifier       = (*procStore)(nil)
	_ leasehold.BatchRenewer   = (*procStore)(nil)
	_ leasehold.ForceReleaser  = (*procStore)(nil)
	_ leasehold.Semaphorer     = (*procStore)(nil)
	_ leasehold.PermitNotifier = (*procStore)(nil)
)

// fullStore is a store with every optional capability.
type fullStore interface {
	leasehold.Store
	leasehold.Inspector
	leasehold.Notifier
	leasehold.BatchRenewer
	leasehold.ForceReleaser
	leasehold.Semaphorer
	leasehold.PermitNotifier
}

// newProcStore wraps st for one replica process; it fails when st lacks an
// optional capability.
func newProcStore(st leasehold.Store, rec callRecorder, replica int, applied func(error) bool, late time.Duration) (*procStore, error) {
	full, ok := st.(fullStore)
	if !ok {
		return nil, fmt.Errorf("%w: the drill needs a store with every optional capability (Inspector, Notifier, BatchRenewer, ForceReleaser, Semaphorer, PermitNotifier); %T lacks one", ErrSetup, st)
	}
	return &procStore{inner: full, rec: rec, replica: replica, applied: applied, late: late}, nil
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

// gate blocks while the process is frozen and fails when it is dead.
func (p *procStore) gate(ctx context.Context) error {
	p.mu.Lock()
	dead, frozen := p.dead, p.frozen
	p.mu.Unlock()
	if dead {
		return errProcessDead
	}
	if frozen != nil {
		select {
		case <-frozen:
		case <-ctx.Done():
			return ctx.Err()
		}
		p.mu.Lock()
		dead = p.dead
		p.mu.Unlock()
		if dead {
			return errProcessDead
		}
	}
	return nil
}

func (p *procStore) Acquire(ctx context.Context, req leasehold.AcquireRequest) (leasehold.Grant, error) {
	key, token := req.Key, req.Token
	if err := p.gate(ctx); err != nil {
		return leasehold.Grant{}, err
	}
	call := p.rec.begin(token)
	g, err := p.inner.Acquire(ctx, req)
	p.end(token, call, err)
	if err == nil {
		p.rec.acquired(Acquisition{Key: key, Token: token, Fence: g.Fence, Replica: p.replica, Call: call, At: p.rec.since()})
	}
	return g, err
}

// AcquirePermit, RenewPermit and ReleasePermit are recorded as Acquire,
// Renew and Release are (the semaphore workload).
func (p *procStore) AcquirePermit(ctx context.Context, req leasehold.PermitRequest) (leasehold.Grant, error) {
	if err := p.gate(ctx); err != nil {
		return leasehold.Grant{}, err
	}
	call := p.rec.begin(req.Token)
	g, err := p.inner.AcquirePermit(ctx, req)
	p.end(req.Token, call, err)
	if err == nil {
		p.rec.acquired(Acquisition{Key: req.Key, Token: req.Token, Fence: g.Fence, Replica: p.replica, Call: call, At: p.rec.since()})
	}
	return g, err
}

func (p *procStore) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := p.gate(ctx); err != nil {
		return err
	}
	call := p.rec.begin(token)
	err := p.inner.RenewPermit(ctx, key, token, ttl)
	p.end(token, call, err)
	return err
}

func (p *procStore) ReleasePermit(ctx context.Context, key, token string) error {
	if err := p.gate(ctx); err != nil {
		return err
	}
	call := p.rec.begin(token)
	err := p.inner.ReleasePermit(ctx, key, token)
	p.rec.end(token, call, false, 0)
	return err
}

func (p *procStore) Permits(ctx context.Context, key string) (leasehold.PermitInfo, error) {
	if err := p.gate(ctx); err != nil {
		return leasehold.PermitInfo{}, err
	}
	return p.inner.Permits(ctx, key)
}

// WaitPermit forwards to the shared store's permit notifier.
func (p *procStore) WaitPermit(ctx context.Context, key, token string) (<-chan struct{}, func(), error) {
	if err := p.gate(ctx); err != nil {
		return nil, nil, err
	}
	return p.inner.WaitPermit(ctx, key, token)
}

func (p *procStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := p.gate(ctx); err != nil {
		return err
	}
	call := p.rec.begin(token)
	err := p.inner.Renew(ctx, key, token, ttl)
	p.end(token, call, err)
	return err
}

// end records an acquire or renew: applied when it succeeded, maybe applied
// (up to p.late after its return) when it failed without an answer.
func (p *procStore) end(token string, call time.Duration, err error) {
	switch {
	case err == nil:
		p.rec.end(token, call, true, 0)
	case p.applied(err):
		p.rec.end(token, call, true, p.late)
	default:
		p.rec.end(token, call, false, 0)
	}
}

func (p *procStore) Release(ctx context.Context, key, token string) error {
	if err := p.gate(ctx); err != nil {
		return err
	}
	call := p.rec.begin(token)
	err := p.inner.Release(ctx, key, token)
	p.rec.end(token, call, false, 0)
	return err
}

func (p *procStore) Inspect(ctx context.Context, key string) (leasehold.LockInfo, error) {
	if err := p.gate(ctx); err != nil {
		return leasehold.LockInfo{}, err
	}
	return p.inner.Inspect(ctx, key)
}

func (p *procStore) List(ctx context.Context, prefix string) ([]leasehold.LockInfo, error) {
	if err := p.gate(ctx); err != nil {
		return nil, err
	}
	return p.inner.List(ctx, prefix)
}

// WaitRelease forwards to the shared store's notifier.
func (p *procStore) WaitRelease(ctx context.Context, key, token string) (<-chan struct{}, func(), error) {
	if err := p.gate(ctx); err != nil {
		return nil, nil, err
	}
	return p.inner.WaitRelease(ctx, key, token)
}

// RenewBatch renews in one round trip, recording each renewal as Renew does.
func (p *procStore) RenewBatch(ctx context.Context, reqs []leasehold.RenewRequest) []error {
	errs := make([]error, len(reqs))
	if err := p.gate(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	calls := make([]time.Duration, len(reqs))
	for i, r := range reqs {
		calls[i] = p.rec.begin(r.Token)
	}
	errs = p.inner.RenewBatch(ctx, reqs)
	for i, r := range reqs {
		p.end(r.Token, calls[i], errs[i])
	}
	return errs
}

// ForceRelease forwards the break-glass release.
func (p *procStore) ForceRelease(ctx context.Context, key string) (leasehold.LockInfo, error) {
	if err := p.gate(ctx); err != nil {
		return leasehold.LockInfo{}, err
	}
	return p.inner.ForceRelease(ctx, key)
}

// waitThaw waits until the process is thawed or ctx ends (then it thaws).
func (p *procStore) waitThaw(ctx context.Context) {
	p.mu.Lock()
	frozen := p.frozen
	p.mu.Unlock()
	if frozen == nil {
		return
	}
	select {
	case <-frozen:
	case <-ctx.Done():
		p.thaw()
	}
}
