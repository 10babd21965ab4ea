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
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/waiters"
)

// Injected failures. Both are store failures to a Locker (they match neither
// ErrNotAcquired nor ErrNotOwned).
var (
	// ErrUnavailable is returned while the store is down. It wraps
	// driver.ErrUnavailable: an outage, on which a FailOpen Locker
	// fails open.
	ErrUnavailable = fmt.Errorf("memstore: store unavailable: %w", driver.ErrUnavailable)
	// ErrReplyLost is returned when a fault dropped the reply of an
	// operation the store did apply; like a request timeout, it is an outage
	// (it wraps driver.ErrUnavailable).
	ErrReplyLost = fmt.Errorf("memstore: reply lost: %w", driver.ErrUnavailable)
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
	// OpForceRelease is ForceRelease, a release without a token.
	OpForceRelease Op = "force_release"
	// OpRefreshQueue is one RefreshQueue call (key ""), as OpRenewBatch.
	OpRefreshQueue Op = "refresh_queue"
	OpInspect      Op = "inspect"
	OpList         Op = "list"
	// OpWaitRelease is the subscription of WaitRelease: a Delay stalls it
	// (until its context ends), as a hung notification path does.
	OpWaitRelease Op = "wait_release"
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
	queues  map[string][]waiter // per key, FIFO; pruned of expired entries before every decision
	last    uint64              // the last fence handed out, for any key
	ops     int
	waiters waiters.Set

	sems       map[string]*semaphore // semaphore.go
	semWaiters waiters.Set
}

type entry struct {
	token    string
	holder   string
	fence    uint64
	acquired time.Time
	expires  time.Time
}

// waiter is one entry of a key's queue.
type waiter struct {
	token    string
	holder   string
	deadline time.Time // the entry is dropped at this time
}

var (
	_ driver.Store          = (*Store)(nil)
	_ driver.Inspector      = (*Store)(nil)
	_ driver.Notifier       = (*Store)(nil)
	_ driver.ForceReleaser  = (*Store)(nil)
	_ driver.BatchRenewer   = (*Store)(nil)
	_ driver.QueueRefresher = (*Store)(nil)
)

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{
		now:    time.Now,
		locks:  make(map[string]*entry),
		queues: make(map[string][]waiter),
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
// (false): a store outage. Coming back up wakes every waiter, as a
// reconnected notification path does.
func (s *Store) SetDown(down bool) {
	s.faultMu.Lock()
	was := s.down
	s.down = down
	s.faultMu.Unlock()
	if was && !down {
		s.waiters.WakeAll()
		s.semWaiters.WakeAll()
	}
}

// SetLatency adds d to every call (0 removes it).
func (s *Store) SetLatency(d time.Duration) {
	s.faultMu.Lock()
	s.latency = d
	s.faultMu.Unlock()
}

// Restart simulates a store restart that loses its data: every lock, every
// semaphore and every waiter queue are gone, and every waiter is woken to
// re-check. The fence counter stays, as a real store's clock floor keeps
// its fences rising: this one counter for every key runs ahead of the clock
// (many grants in a microsecond, or a clock that stands still), so the
// floor alone would hand out fences again.
func (s *Store) Restart() {
	s.mu.Lock()
	s.locks = make(map[string]*entry)
	s.sems = nil
	s.queues = make(map[string][]waiter)
	s.mu.Unlock()
	s.waiters.WakeAll()
	s.semWaiters.WakeAll()
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

// queue returns key's queue without its expired entries. s.mu must be held.
func (s *Store) queue(key string, now time.Time) []waiter {
	q := s.queues[key]
	live := q[:0]
	for _, w := range q {
		if now.Before(w.deadline) {
			live = append(live, w)
		}
	}
	if len(live) == 0 {
		delete(s.queues, key)
		return nil
	}
	s.queues[key] = live
	return live
}

func position(q []waiter, token string) int {
	for i, w := range q {
		if w.token == token {
			return i
		}
	}
	return -1
}

// dequeue removes token from key's queue and reports whether it was the
// head. s.mu must be held.
func (s *Store) dequeue(key, token string, now time.Time) (wasHead bool) {
	q := s.queue(key, now)
	i := position(q, token)
	if i < 0 {
		return false
	}
	q = append(q[:i], q[i+1:]...)
	if len(q) == 0 {
		delete(s.queues, key)
	} else {
		s.queues[key] = q
	}
	return i == 0
}

// wakeHead wakes the head of key's queue, only that waiter; with an empty
// queue it wakes every subscriber of key (none has a place to keep). s.mu
// must be held.
func (s *Store) wakeHead(key string, now time.Time) {
	if q := s.queue(key, now); len(q) > 0 {
		s.waiters.WakeToken(key, q[0].token)
		return
	}
	s.waiters.Wake(key)
}

// Acquire implements driver.Store, with the queue rule of
// driver.Store. The fence is max(last+1, clock in µs): strictly
// increasing across all keys, and after Restart.
func (s *Store) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	f, err := s.before(ctx, OpAcquire, req.Key)
	if err != nil {
		return driver.Grant{}, err
	}
	s.mu.Lock()
	now := s.now()
	g, err := s.acquire(req, now)
	if s.ops++; s.ops%1024 == 0 {
		s.sweep(now)
	}
	s.mu.Unlock()
	if f.DropReply {
		return driver.Grant{}, ErrReplyLost
	}
	return g, err
}

// acquire decides one acquire at now. s.mu must be held.
func (s *Store) acquire(req driver.AcquireRequest, now time.Time) (driver.Grant, error) {
	q := s.queue(req.Key, now)
	e := s.live(req.Key, now)
	switch {
	case e != nil && e.token == req.Token: // our own retry after a lost reply
		e.expires = now.Add(req.TTL)
		s.dequeue(req.Key, req.Token, now)
		return driver.Grant{Fence: e.fence}, nil
	case e == nil && (len(q) == 0 || q[0].token == req.Token):
		s.dequeue(req.Key, req.Token, now)
		s.last = max(s.last+1, uint64(max(now.UnixMicro(), 0)))
		s.locks[req.Key] = &entry{token: req.Token, holder: req.Holder, fence: s.last, acquired: now, expires: now.Add(req.TTL)}
		return driver.Grant{Fence: s.last}, nil
	}
	var g driver.Grant
	if e != nil {
		g.Remaining, g.Holder = e.expires.Sub(now), e.holder
	}
	i := position(q, req.Token)
	switch {
	case req.QueueTTL <= 0:
		g.Ahead = len(q)
		if i >= 0 {
			g.Ahead = i
		}
	case i >= 0:
		q[i].deadline, q[i].holder = now.Add(req.QueueTTL), req.Holder
		g.Ahead = i
	default:
		s.queues[req.Key] = append(q, waiter{token: req.Token, holder: req.Holder, deadline: now.Add(req.QueueTTL)})
		g.Ahead = len(q)
	}
	return g, driver.ErrNotAcquired
}

func (s *Store) sweep(now time.Time) {
	for k := range s.locks {
		s.live(k, now)
	}
	for k := range s.queues {
		s.queue(k, now)
	}
}

// Renew implements driver.Store.
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
		return after(f, driver.ErrNotOwned)
	}
	e.expires = now.Add(ttl)
	s.mu.Unlock()
	return after(f, nil)
}

// RenewBatch implements driver.BatchRenewer: every renewal in one call,
// with one fault decision (OpRenewBatch) for the whole batch, as one round
// trip has.
func (s *Store) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	errs := make([]error, len(reqs))
	f, err := s.before(ctx, OpRenewBatch, "")
	if err != nil {
		return fill(errs, err)
	}
	s.mu.Lock()
	now := s.now()
	for i, r := range reqs {
		e := s.live(r.Key, now)
		if e == nil || e.token != r.Token {
			errs[i] = after(f, driver.ErrNotOwned)
			continue
		}
		e.expires = now.Add(r.TTL)
		errs[i] = after(f, nil)
	}
	s.mu.Unlock()
	return errs
}

// fill sets every error of a batch that failed as a whole to err.
func fill(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// RefreshQueue implements driver.QueueRefresher: every refresh in one call,
// with one fault decision (OpRefreshQueue) for the whole batch.
func (s *Store) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	errs := make([]error, len(reqs))
	f, err := s.before(ctx, OpRefreshQueue, "")
	if err != nil {
		return fill(errs, err)
	}
	s.mu.Lock()
	now := s.now()
	for i, r := range reqs {
		errs[i] = after(f, s.refresh(r, now))
	}
	s.mu.Unlock()
	return errs
}

// refresh extends r's queue entry. s.mu must be held.
func (s *Store) refresh(r driver.QueueRefresh, now time.Time) error {
	q := s.queue(r.Key, now)
	i := position(q, r.Token)
	if i < 0 {
		return driver.ErrNotQueued
	}
	if dl := now.Add(r.QueueTTL); dl.After(q[i].deadline) {
		q[i].deadline = dl
	}
	if s.live(r.Key, now) == nil {
		return driver.ErrNotHeld
	}
	return nil
}

// Release implements driver.Store: it removes token from key's queue and
// deletes key if token owns it. It wakes the head of the queue (only the
// head) when the key is free afterwards and the head is new: after a
// release, and when the departing token was the head of a free key.
func (s *Store) Release(ctx context.Context, key, token string) error {
	f, err := s.before(ctx, OpRelease, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	wasHead := s.dequeue(key, token, now)
	e := s.live(key, now)
	switch {
	case e == nil:
		if wasHead {
			s.wakeHead(key, now)
		}
		err = driver.ErrNotHeld
	case e.token != token:
		err = driver.ErrNotOwned
	default:
		delete(s.locks, key)
		s.wakeHead(key, now)
	}
	s.mu.Unlock()
	return after(f, err)
}

// ForceRelease implements driver.ForceReleaser. It wakes the head of the
// key's queue. Faults apply to it as OpForceRelease.
func (s *Store) ForceRelease(ctx context.Context, key string) (driver.LockInfo, error) {
	f, err := s.before(ctx, OpForceRelease, key)
	if err != nil {
		return driver.LockInfo{}, err
	}
	s.mu.Lock()
	now := s.now()
	e := s.live(key, now)
	if e == nil {
		s.mu.Unlock()
		return driver.LockInfo{}, after(f, driver.ErrNotHeld)
	}
	info := s.info(key, e, now)
	delete(s.locks, key)
	s.wakeHead(key, now)
	s.mu.Unlock()
	return info, after(f, nil)
}

// info describes key's lock e and queue. s.mu must be held.
func (s *Store) info(key string, e *entry, now time.Time) driver.LockInfo {
	info := driver.LockInfo{
		Key: key, Token: e.token, Holder: e.holder, Fence: e.fence, Remaining: e.expires.Sub(now),
		Facts: map[string]string{"store": "memory", "acquired": e.acquired.UTC().Format(time.RFC3339Nano)},
	}
	if q := s.queue(key, now); len(q) > 0 {
		info.Waiting, info.NextHolder = len(q), q[0].holder
	}
	return info
}

// Inspect implements driver.Inspector.
func (s *Store) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	f, err := s.before(ctx, OpInspect, key)
	if err != nil {
		return driver.LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.live(key, now)
	if e == nil {
		return driver.LockInfo{}, after(f, driver.ErrNotHeld)
	}
	return s.info(key, e, now), after(f, nil)
}

// List implements driver.Inspector. The memory store holds no entry it
// cannot decode, so it never reports ErrBadEntry.
func (s *Store) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	f, err := s.before(ctx, OpList, prefix)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	now := s.now()
	s.sweep(now)
	out := make([]driver.LockInfo, 0, len(s.locks))
	for k, e := range s.locks {
		if strings.HasPrefix(k, prefix) {
			out = append(out, s.info(k, e, now))
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, after(f, nil)
}

// WaitRelease implements driver.Notifier. The channel receives a value
// when token becomes the head of key's queue while key is free (a release,
// a force release, or the head before it leaving), when key is released with
// an empty queue (every subscriber of key wakes), and after Restart or an
// outage ends (SetDown(false)), when every waiter re-checks. A lock that
// expires sends nothing: the waiter wakes at the Remaining its Acquire
// reported. Faults apply to it as OpWaitRelease.
func (s *Store) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	f, err := s.before(ctx, OpWaitRelease, key)
	if err != nil {
		return nil, nil, err
	}
	if f.DropReply {
		return nil, nil, ErrReplyLost
	}
	ch, stop := s.waiters.AddToken(key, token, token != "")
	return ch, stop, nil
}
