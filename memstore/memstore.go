// Package memstore is the embedded, in-process lock store: the default for
// tests, single-process programs and `leasehold drill`.
//
// It has the same semantics as the networked stores — TTL expiry, token-
// checked renew and release, fences that never go backward, release
// notifications — and can inject faults (outage, latency, stalls, lost
// replies, a restart that loses every lock) for tests and game days.
//
// It excludes goroutines of one process only. A Store is safe for concurrent
// use; its zero value is not usable, call New.
package memstore

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/waiters"
)

// Injected failures. Both are store failures to a Locker (they match neither
// ErrNotAcquired nor ErrNotOwned).
var (
	// ErrUnavailable is returned while the store is down.
	ErrUnavailable = errors.New("memstore: store unavailable")
	// ErrReplyLost is returned when a fault dropped the reply of an
	// operation the store did apply.
	ErrReplyLost = errors.New("memstore: reply lost")
)

// Op names a store operation, for fault injection.
type Op string

// Operations.
const (
	OpAcquire Op = "acquire"
	OpRenew   Op = "renew"
	// OpRenewBatch is one RenewBatch call (key ""): one round trip for many
	// renewals. Its fault applies to the whole batch.
	OpRenewBatch Op = "renew_batch"
	OpRelease    Op = "release"
	OpInspect    Op = "inspect"
	OpList       Op = "list"
)

// Fault is what happens to one call.
type Fault struct {
	// Delay is added latency before the call is applied; the call fails with
	// the context's error if its context ends first (a stall).
	Delay time.Duration
	// Err fails the call, without applying it, after Delay.
	Err error
	// DropReply applies the call and then returns ErrReplyLost instead of its
	// result, as when a reply is lost on the network.
	DropReply bool
}

// FaultFunc decides the fault for one call; the zero Fault means none. It is
// called with no store lock held and may be called concurrently.
type FaultFunc func(op Op, key string) Fault

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock used for expiry (and for the fence floor).
// Default time.Now.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// Store is the in-memory lock store.
type Store struct {
	now func() time.Time

	faultMu sync.RWMutex
	fault   FaultFunc
	down    bool
	latency time.Duration

	mu      sync.Mutex
	locks   map[string]*entry
	last    uint64 // the last fence handed out, for any key
	ops     int
	waiters waiters.Set

	sems       map[string]*semaphore // semaphore.go
	semWaiters waiters.Set
}

type entry struct {
	token    string
	fence    uint64
	acquired time.Time
	expires  time.Time
}

var (
	_ leasehold.Store         = (*Store)(nil)
	_ leasehold.Notifier      = (*Store)(nil)
	_ leasehold.ForceReleaser = (*Store)(nil)
	_ leasehold.BatchRenewer  = (*Store)(nil)
)

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{
		now:   time.Now,
		locks: make(map[string]*entry),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// SetFaults installs f for every later call; nil removes it.
func (s *Store) SetFaults(f FaultFunc) {
	s.faultMu.Lock()
	s.fault = f
	s.faultMu.Unlock()
}

// SetDown makes every call fail with ErrUnavailable (true) or work again
// (false): a store outage.
func (s *Store) SetDown(down bool) {
	s.faultMu.Lock()
	s.down = down
	s.faultMu.Unlock()
}

// SetLatency adds d to every call (0 removes it).
func (s *Store) SetLatency(d time.Duration) {
	s.faultMu.Lock()
	s.latency = d
	s.faultMu.Unlock()
}

// Restart simulates a store restart that loses its data: every lock and the
// fence counter are gone. Fences stay monotonic through the clock-based floor
// (see Acquire), as long as the clock does not go backward.
func (s *Store) Restart() {
	s.mu.Lock()
	s.locks = make(map[string]*entry)
	s.sems = nil
	s.last = 0
	s.mu.Unlock()
}

func (s *Store) before(ctx context.Context, op Op, key string) (Fault, error) {
	s.faultMu.RLock()
	f, down, lat := s.fault, s.down, s.latency
	s.faultMu.RUnlock()
	var flt Fault
	if f != nil {
		flt = f(op, key)
	}
	if d := flt.Delay + lat; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return flt, ctx.Err()
		}
	}
	switch {
	case flt.Err != nil:
		return flt, flt.Err
	case down:
		return flt, ErrUnavailable
	}
	return flt, ctx.Err()
}

func after(f Fault, err error) error {
	if f.DropReply {
		return ErrReplyLost
	}
	return err
}

// live returns key's entry if it has not expired, deleting it if it has.
// s.mu must be held.
func (s *Store) live(key string, now time.Time) *entry {
	e := s.locks[key]
	if e != nil && !now.Before(e.expires) {
		delete(s.locks, key)
		return nil
	}
	return e
}

// Acquire implements leasehold.Store. The fence is max(last+1, clock in µs):
// strictly increasing across all keys, and still increasing after Restart.
func (s *Store) Acquire(ctx context.Context, req leasehold.AcquireRequest) (leasehold.Grant, error) {
	key, token, ttl := req.Key, req.Token, req.TTL
	f, err := s.before(ctx, OpAcquire, key)
	if err != nil {
		return leasehold.Grant{}, err
	}
	s.mu.Lock()
	now := s.now()
	var g leasehold.Grant
	if e := s.live(key, now); e != nil {
		if e.token != token {
			remaining := e.expires.Sub(now)
			s.mu.Unlock()
			return leasehold.Grant{Remaining: remaining}, leasehold.ErrNotAcquired
		}
		e.expires = now.Add(ttl) // our own retry after a lost reply
		g.Fence = e.fence
	} else {
		s.last = max(s.last+1, uint64(max(now.UnixMicro(), 0)))
		s.locks[key] = &entry{token: token, fence: s.last, acquired: now, expires: now.Add(ttl)}
		g.Fence = s.last
	}
	if s.ops++; s.ops%1024 == 0 {
		s.sweep(now)
	}
	s.mu.Unlock()
	return g, after(f, nil)
}

func (s *Store) sweep(now time.Time) {
	for k := range s.locks {
		s.live(k, now)
	}
}

// Renew implements leasehold.Store.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	f, err := s.before(ctx, OpRenew, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	e := s.live(key, now)
	if e == nil || e.token != token {
		s.mu.Unlock()
		return after(f, leasehold.ErrNotOwned)
	}
	e.expires = now.Add(ttl)
	s.mu.Unlock()
	return after(f, nil)
}

// RenewBatch implements leasehold.BatchRenewer: every renewal in one call,
// with one fault decision (OpRenewBatch) for the whole batch, as one round
// trip has.
func (s *Store) RenewBatch(ctx context.Context, reqs []leasehold.RenewRequest) []error {
	errs := make([]error, len(reqs))
	f, err := s.before(ctx, OpRenewBatch, "")
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	s.mu.Lock()
	now := s.now()
	for i, r := range reqs {
		e := s.live(r.Key, now)
		if e == nil || e.token != r.Token {
			errs[i] = after(f, leasehold.ErrNotOwned)
			continue
		}
		e.expires = now.Add(r.TTL)
		errs[i] = after(f, nil)
	}
	s.mu.Unlock()
	return errs
}

// Release implements leasehold.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	f, err := s.before(ctx, OpRelease, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	e := s.live(key, s.now())
	if e == nil || e.token != token {
		s.mu.Unlock()
		return after(f, leasehold.ErrNotOwned)
	}
	delete(s.locks, key)
	s.notify(key)
	s.mu.Unlock()
	return after(f, nil)
}

// ForceRelease implements leasehold.ForceReleaser.
func (s *Store) ForceRelease(ctx context.Context, key string) (leasehold.LockInfo, error) {
	f, err := s.before(ctx, OpRelease, key)
	if err != nil {
		return leasehold.LockInfo{}, err
	}
	s.mu.Lock()
	now := s.now()
	e := s.live(key, now)
	if e == nil {
		s.mu.Unlock()
		return leasehold.LockInfo{}, after(f, leasehold.ErrNotHeld)
	}
	info := s.info(key, e, now)
	delete(s.locks, key)
	s.notify(key)
	s.mu.Unlock()
	return info, after(f, nil)
}

// notify wakes key's waiters.
func (s *Store) notify(key string) { s.waiters.Wake(key) }

func (s *Store) info(key string, e *entry, now time.Time) leasehold.LockInfo {
	return leasehold.LockInfo{
		Key: key, Token: e.token, Fence: e.fence, Remaining: e.expires.Sub(now),
		Facts: map[string]string{"store": "memory", "acquired": e.acquired.UTC().Format(time.RFC3339Nano)},
	}
}

// Inspect implements leasehold.Store.
func (s *Store) Inspect(ctx context.Context, key string) (leasehold.LockInfo, error) {
	f, err := s.before(ctx, OpInspect, key)
	if err != nil {
		return leasehold.LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.live(key, now)
	if e == nil {
		return leasehold.LockInfo{}, after(f, leasehold.ErrNotHeld)
	}
	return s.info(key, e, now), after(f, nil)
}

// List implements leasehold.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]leasehold.LockInfo, error) {
	f, err := s.before(ctx, OpList, prefix)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	now := s.now()
	s.sweep(now)
	out := make([]leasehold.LockInfo, 0, len(s.locks))
	for k, e := range s.locks {
		if strings.HasPrefix(k, prefix) {
			out = append(out, s.info(k, e, now))
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, after(f, nil)
}

// WaitRelease implements leasehold.Notifier. Expiry sends no notification.
func (s *Store) WaitRelease(_ context.Context, key, _ string) (<-chan struct{}, func(), error) {
	ch, stop := s.waiters.Add(key)
	return ch, stop, nil
}
