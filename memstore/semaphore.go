package memstore

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// Semaphore operations, for fault injection.
const (
	OpAcquirePermit Op = "acquire_permit"
	OpRenewPermit   Op = "renew_permit"
	OpReleasePermit Op = "release_permit"
	OpPermits       Op = "permits"
	// OpWaitPermit is WaitPermit's subscription, as OpWaitRelease.
	OpWaitPermit Op = "wait_permit"
)

var (
	_ driver.Semaphorer     = (*Store)(nil)
	_ driver.PermitNotifier = (*Store)(nil)
)

// semaphore is one key's permits and waiter queue. Guarded by Store.mu.
type semaphore struct {
	limit   int
	holders map[string]*permit
	queue   []waiter // FIFO
}

type permit struct {
	fence    uint64
	holder   string
	acquired time.Time
	expires  time.Time
}

// sem returns key's semaphore after pruning expired holders and waiters,
// creating it when create is set (nil otherwise when there is none).
// s.mu must be held.
func (s *Store) sem(key string, now time.Time, create bool) *semaphore {
	if s.sems == nil {
		s.sems = make(map[string]*semaphore)
	}
	m := s.sems[key]
	if m == nil {
		if !create {
			return nil
		}
		m = &semaphore{holders: make(map[string]*permit)}
		s.sems[key] = m
		return m
	}
	for tok, p := range m.holders {
		if !now.Before(p.expires) {
			delete(m.holders, tok)
		}
	}
	live := m.queue[:0]
	for _, w := range m.queue {
		if now.Before(w.deadline) {
			live = append(live, w)
		}
	}
	clear(m.queue[len(live):])
	m.queue = live
	if !create && len(m.holders) == 0 && len(m.queue) == 0 {
		delete(s.sems, key)
		return nil
	}
	return m
}

// position returns token's index in the queue, or -1.
func (m *semaphore) position(token string) int {
	for i, w := range m.queue {
		if w.token == token {
			return i
		}
	}
	return -1
}

func (m *semaphore) leave(token string) bool {
	i := m.position(token)
	if i < 0 {
		return false
	}
	m.queue = append(m.queue[:i], m.queue[i+1:]...)
	return true
}

// soonest returns the live holder that expires first.
func (m *semaphore) soonest() *permit {
	var first *permit
	for _, p := range m.holders {
		if first == nil || p.expires.Before(first.expires) {
			first = p
		}
	}
	return first
}

// AcquirePermit implements driver.Semaphorer. The fence comes from the
// same counter as Acquire's: max(last+1, clock in µs).
func (s *Store) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	if req.Limit < 1 {
		return driver.Grant{}, fmt.Errorf("%w: memstore: permit limit must be at least 1, got %d", driver.ErrInvalidOptions, req.Limit)
	}
	f, err := s.before(ctx, OpAcquirePermit, req.Key)
	if err != nil {
		return driver.Grant{}, err
	}
	s.mu.Lock()
	g, err := s.acquirePermit(req, s.now())
	s.mu.Unlock()
	return g, after(f, err)
}

func (s *Store) acquirePermit(req driver.PermitRequest, now time.Time) (driver.Grant, error) {
	if s.ops++; s.ops%1024 == 0 { // drop semaphores nobody touched since they emptied
		for k := range s.sems {
			s.sem(k, now, false)
		}
	}
	m := s.sem(req.Key, now, true)
	m.limit = req.Limit
	if p := m.holders[req.Token]; p != nil { // our own retry after a lost reply
		p.expires = now.Add(req.TTL)
		m.leave(req.Token)
		return driver.Grant{Fence: p.fence}, nil
	}
	free := req.Limit - len(m.holders)
	pos := m.position(req.Token)
	ahead := pos
	if pos < 0 {
		ahead = len(m.queue)
	}
	if ahead < free {
		if pos >= 0 {
			m.leave(req.Token)
		}
		s.last = max(s.last+1, uint64(max(now.UnixMicro(), 0)))
		m.holders[req.Token] = &permit{fence: s.last, holder: req.Holder, acquired: now, expires: now.Add(req.TTL)}
		return driver.Grant{Fence: s.last}, nil
	}
	if req.QueueTTL > 0 {
		if pos < 0 {
			m.queue = append(m.queue, waiter{token: req.Token, holder: req.Holder})
			pos = len(m.queue) - 1
		}
		m.queue[pos].deadline = now.Add(req.QueueTTL)
	}
	g := driver.Grant{Ahead: ahead}
	if free <= 0 {
		if p := m.soonest(); p != nil {
			g.Remaining, g.Holder = p.expires.Sub(now), p.holder
		}
	}
	if len(m.holders) == 0 && len(m.queue) == 0 {
		delete(s.sems, req.Key)
	}
	return g, driver.ErrNotAcquired
}

// RenewPermit implements driver.Semaphorer.
func (s *Store) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	f, err := s.before(ctx, OpRenewPermit, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	m := s.sem(key, now, false)
	if m == nil || m.holders[token] == nil {
		return after(f, driver.ErrNotOwned)
	}
	m.holders[token].expires = now.Add(ttl)
	return after(f, nil)
}

// ReleasePermit implements driver.Semaphorer.
func (s *Store) ReleasePermit(ctx context.Context, key, token string) error {
	f, err := s.before(ctx, OpReleasePermit, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	m := s.sem(key, now, false)
	if m == nil {
		return after(f, driver.ErrNotHeld)
	}
	free, pos := m.limit-len(m.holders), m.position(token)
	left := m.leave(token)
	_, held := m.holders[token]
	delete(m.holders, token)
	if held || (left && pos < free) { // a permit freed, or a waiter whose turn had come left
		s.wakePermits(key, m, held)
	}
	if len(m.holders) == 0 && len(m.queue) == 0 {
		delete(s.sems, key)
	}
	if !held {
		return after(f, driver.ErrNotHeld)
	}
	return after(f, nil)
}

// wakePermits wakes the first F live waiters of key's queue, F the permits
// free now (limit minus live holders): the waiters whose turn came, and no
// other. With an empty queue a freed permit wakes every subscriber of key
// (none has a place to keep). s.mu must be held.
func (s *Store) wakePermits(key string, m *semaphore, freed bool) {
	if len(m.queue) == 0 {
		if freed {
			s.semWaiters.Wake(key)
		}
		return
	}
	for i := range min(m.limit-len(m.holders), len(m.queue)) {
		s.semWaiters.WakeToken(key, m.queue[i].token)
	}
}

// Permits implements driver.Semaphorer.
func (s *Store) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	f, err := s.before(ctx, OpPermits, key)
	if err != nil {
		return driver.PermitInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	info := driver.PermitInfo{Key: key}
	m := s.sem(key, now, false)
	if m == nil {
		return info, after(f, nil)
	}
	info.Limit, info.Waiting = m.limit, len(m.queue)
	if len(m.queue) > 0 {
		info.NextHolder = m.queue[0].holder
	}
	for tok, p := range m.holders {
		info.Holders = append(info.Holders, driver.LockInfo{
			Key: key, Token: tok, Holder: p.holder, Fence: p.fence, Remaining: p.expires.Sub(now),
			Facts: map[string]string{"store": "memory", "acquired": p.acquired.UTC().Format(time.RFC3339Nano)},
		})
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Fence < info.Holders[j].Fence })
	return info, after(f, nil)
}

// WaitPermit implements driver.PermitNotifier. The channel receives a
// value when a ReleasePermit leaves token among the first F live waiters of
// key's queue, F the permits free afterwards (under the limit the store saw
// last): a release wakes only as many heads as permits are free, and a
// waiter whose turn had come leaving passes its turn on. A freed permit with
// an empty queue wakes every subscriber of key. Expiry sends no
// notification; Restart and the end of an outage wake every waiter. Faults
// apply to it as OpWaitPermit.
func (s *Store) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	f, err := s.before(ctx, OpWaitPermit, key)
	if err != nil {
		return nil, nil, err
	}
	if f.DropReply {
		return nil, nil, ErrReplyLost
	}
	ch, stop := s.semWaiters.AddToken(key, token, token != "")
	return ch, stop, nil
}
