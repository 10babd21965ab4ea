package leasehold

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// scheduler owns the timing of every lease of one Locker: one goroutine and
// one heap of deadlines, however many leases are held. The goroutine runs
// while the Locker holds a lease, until Close; after the last lease ended it
// notices at its next timer (armed) and exits idleLinger later.
//
// The goroutine is woken only when a deadline earlier than the one its timer
// is armed for reaches the head of the heap. Adding a lease whose first
// deadline is later, and ending a lease, do not wake it: the timer fires at
// the old deadline, finds nothing due, and is armed again for the new head.
// So an uncontended TryAcquire + Release cycle costs no goroutine wake-up.
//
// Each held lease sits in the heap at its next deadline, the earliest of:
//
//	maxHoldAt   MaxHold since acquisition (until capped)
//	validUntil  the local expiry guard (unless switched off by RenewalContinue)
//	renewAt     the next automatic renewal (not while one is in flight)
//
// A lease's state, guarded by scheduler.mu:
//
//	held ──renewAt due──▶ held+renewing ──ok──────────▶ held (failures = 0, deadlines move on)
//	                                    ──failed──────▶ held (failures+1, retry spread before the guard)
//	                                    ──failed N────▶ over: ErrLeaseAbandoned
//	                                    ──not owned───▶ over: ErrLeaseLost
//	held(+renewing) ──validUntil due──▶ over: ErrLeaseExpired
//	held(+renewing) ──maxHoldAt due──▶ held, capped: ErrMaxHoldReached, no more renewal
//	held(+renewing) ──Release / Close──▶ over: ErrLeaseReleased / ErrLockerClosed
//
// over is final: the lease leaves the heap and the set, and whatever ended
// it (the scheduler, a renewal goroutine, Release, Close) reports it once.
// A renewal runs in a goroutine the scheduler owns (wg), never on the
// scheduler's own goroutine, so a slow store cannot delay another lease's
// guard; due renewals queue and at most maxRenewCalls store calls are in
// flight (see pacing.go). A renewal that comes back after its lease went
// over changes nothing; if it succeeded on a lease that ended without
// releasing (expired, abandoned) it is undone with a token-checked release,
// so no lock outlives the lease that took it.
//
// Every report about a lease (observer, log, context cancel) made outside the
// mutex is counted in Lease.acting; Release and Close wait until it is zero,
// so nothing about a lease runs after they returned.
type scheduler struct {
	l *Locker

	mu      sync.Mutex
	cond    sync.Cond // broadcast when a Lease.acting drops to zero
	q       leaseHeap
	leases  map[*Lease]struct{}
	closed  bool // Close began: no new leases, renewal outcomes are ignored
	running bool
	armed   time.Time // when the loop looks at the heap next; zero: only when signalled
	passes  int       // times the loop looked at the heap (tests count wake-ups)

	pending []*Lease            // due renewals not yet sent, oldest first
	calls   int                 // renewal goroutines running (about pace.limit)
	pace    pace                // how late renewals are sent
	batch   driver.BatchRenewer // the store's, or nil

	ctx    context.Context // parent of every renewal; cancelled by Close
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1: the heap's head changed
	stop   chan struct{} // closed by Close
	wg     sync.WaitGroup
}

func newScheduler(l *Locker) *scheduler {
	s := &scheduler{l: l, leases: make(map[*Lease]struct{}), wake: make(chan struct{}, 1), stop: make(chan struct{})}
	s.cond.L = &s.mu
	s.q.epoch = time.Now()
	s.batch, _ = l.store.(driver.BatchRenewer)
	s.pace.limit = 1
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// add registers a new lease and schedules it; false once Close began.
func (s *scheduler) add(ls *Lease) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.leases[ls] = struct{}{}
	ls.idx = -1
	s.fix(ls)
	if !s.running {
		s.running = true
		s.wg.Add(1)
		go s.loop()
	}
	return true
}

// fix puts ls at its next deadline in the heap, or takes it out. s.mu held.
func (s *scheduler) fix(ls *Lease) {
	at := ls.nextDeadline()
	switch {
	case at.IsZero() || ls.over:
		if ls.idx >= 0 {
			heap.Remove(&s.q, ls.idx)
		}
		return
	case ls.idx >= 0:
		ls.at = at
		s.q.items[ls.idx].at = s.q.key(at)
		heap.Fix(&s.q, ls.idx)
	default:
		ls.at = at
		heap.Push(&s.q, ls)
	}
	if s.q.head() == ls && (s.armed.IsZero() || at.Before(s.armed)) {
		s.signal() // the loop would look too late
	}
}

// signal wakes the loop to look at the heap again.
func (s *scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// finish marks ls over with cause and takes it out of the schedule. It
// reports false when ls was already over (someone else ends it). s.mu held.
func (s *scheduler) finish(ls *Lease, cause error) bool {
	if ls.over {
		return false
	}
	ls.over, ls.cause = true, cause
	s.fix(ls)
	delete(s.leases, ls)
	// No wake-up: the loop sees at its armed time that no lease is left.
	return true
}

// loop is the scheduler goroutine: it sleeps until the earliest deadline,
// handles every due lease and goes back to sleep.
func (s *scheduler) loop() {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next, idle := s.runDue(time.Now())
		if next.IsZero() {
			t.Stop()
		} else {
			t.Reset(time.Until(next))
		}
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-t.C:
			if idle && s.stopIdle() {
				return // no lease for a while: add starts the loop again
			}
		}
	}
}

// idleLinger is how long the scheduler goroutine waits for a new lease
// after it found that the last one ended (at its next armed deadline: ending
// a lease does not wake it) before it exits, so that a Locker taking and
// releasing one lease at a time does not start a goroutine per lease.
const idleLinger = 100 * time.Millisecond

// stopIdle marks the loop as not running if the Locker still holds no
// lease, and reports whether it did.
func (s *scheduler) stopIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.leases) > 0 {
		return false
	}
	s.running = false
	return true
}

// step is one thing to report about a lease after runDue dropped the mutex.
type step struct {
	ls   *Lease
	what stepKind
}

type stepKind int

const (
	stepMaxHold  stepKind = iota + 1 // capped: report, cancel with ErrMaxHoldReached
	stepExpired                      // over by the guard: report and end
	stepContinue                     // guard passed under RenewalContinue: report only
)

// runDue handles every lease whose deadline is not after now and returns
// the next deadline (zero: none). It reports idle when no lease is left.
func (s *scheduler) runDue(now time.Time) (next time.Time, idle bool) {
	s.mu.Lock()
	s.passes++
	var steps []step
	var renew []*Lease
	for s.q.Len() > 0 && !s.q.head().at.After(now) {
		ls := s.q.head()
		st, renewNow := ls.due(now, &s.l.opts)
		if st != 0 {
			if st == stepExpired {
				s.finish(ls, ErrLeaseExpired)
			}
			ls.acting++
			steps = append(steps, step{ls, st})
		}
		if renewNow {
			renew = append(renew, ls)
		}
		if !ls.over {
			s.fix(ls) // its next deadline, or out of the heap while renewing
		}
	}
	workers := s.queueRenewals(now, renew)
	if s.q.Len() > 0 {
		next = s.q.head().at
	}
	idle = len(s.leases) == 0
	if idle {
		next = now.Add(idleLinger) // a new lease due earlier signals
	}
	s.armed = next
	s.mu.Unlock()
	for _, st := range steps {
		st.ls.report(st.what)
		s.done(st.ls)
	}
	for range workers {
		s.wg.Add(1)
		go s.renewer()
	}
	return next, idle
}

// done ends one report about ls (see acting).
func (s *scheduler) done(ls *Lease) {
	s.mu.Lock()
	if ls.acting--; ls.acting == 0 {
		s.cond.Broadcast()
	}
	s.mu.Unlock()
}

// quiet waits until nothing reports about ls. s.mu held.
func (s *scheduler) quiet(ls *Lease) {
	for ls.acting > 0 {
		s.cond.Wait()
	}
}

// maxBatch caps how many leases one batch renewal carries.
const maxBatch = 256

// renewal is one store call renewing one lease, or several in a batch.
type renewal struct {
	leases []*Lease
	sent   time.Time
}

// renew makes one renewal store call and applies its outcome.
func (s *scheduler) renew(r renewal) {
	ctx, cancel := context.WithDeadline(s.ctx, r.sent.Add(s.l.opts.RenewTimeout))
	defer cancel()
	s.renewed(r, s.call(ctx, r.leases))
}

// call sends one Renew or RenewBatch and returns one error per lease.
func (s *scheduler) call(ctx context.Context, leases []*Lease) []error {
	if len(leases) == 1 {
		ls := leases[0]
		return []error{ls.ops.renew(ctx, ls.key, ls.token, ls.ttl)}
	}
	if s.batch == nil || !batchable(leases) {
		return renewEach(ctx, leases)
	}
	reqs := make([]driver.RenewRequest, len(leases))
	for i, ls := range leases {
		reqs[i] = driver.RenewRequest{Key: ls.key, Token: ls.token, TTL: ls.ttl}
	}
	errs := s.batch.RenewBatch(ctx, reqs)
	if len(errs) != len(reqs) { // a broken store; never index past it
		errs = make([]error, len(reqs))
		for i := range errs {
			errs[i] = errBatchLength
		}
	}
	return errs
}

// renewed applies the outcomes of an automatic renewal call, one error per
// lease, under one hold of the mutex, and then reports them outside it.
func (s *scheduler) renewed(r renewal, errs []error) {
	const (
		skip = iota
		report
		undo // succeeded on a lease that ended without releasing
	)
	outs := make([]renewOutcome, len(r.leases))
	what := make([]byte, len(r.leases))
	now := time.Now()
	s.mu.Lock()
	for i, ls := range r.leases {
		ls.renewing = false
		if s.closed || ls.over {
			if errs[i] == nil && ls.over && !ls.released {
				what[i] = undo
			}
			continue
		}
		outs[i] = ls.outcome(r.sent, now, errs[i], &s.l.opts)
		if outs[i].cause != nil {
			s.finish(ls, outs[i].cause)
		} else {
			s.fix(ls)
		}
		ls.acting++
		what[i] = report
	}
	s.mu.Unlock()
	for i, ls := range r.leases {
		switch what[i] {
		case report:
			ls.reportRenewal(r.sent, errs[i], outs[i])
		case undo:
			ls.undo()
		}
	}
	s.mu.Lock()
	for i, ls := range r.leases {
		if what[i] != report {
			continue
		}
		if ls.acting--; ls.acting == 0 {
			s.cond.Broadcast()
		}
	}
	s.mu.Unlock()
}

// end makes cause the end of ls unless it is already over, and waits until
// nothing reports about ls any more. It reports whether this call ended it.
func (s *scheduler) end(ls *Lease, cause error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	won := s.finish(ls, cause)
	s.quiet(ls)
	if won {
		ls.released = true // the caller releases in the store (or must not)
	}
	return won
}

// all returns the held leases and marks the scheduler closed: renewal
// outcomes from now on are ignored and no lease is added.
func (s *scheduler) closeAll() []*Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	out := make([]*Lease, 0, len(s.leases))
	for ls := range s.leases {
		out = append(out, ls)
	}
	return out
}

// shutdown stops the scheduler goroutine and joins it and every renewal in
// flight (cancelled first).
func (s *scheduler) shutdown() {
	s.cancel()
	s.mu.Lock()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// leaseHeap orders leases by their next deadline. Each item carries its
// deadline as nanoseconds since epoch (monotonic), so that ordering reads
// the heap's own array and not every lease it compares: a heap of 100,000
// leases is mostly cache misses otherwise.
type leaseHeap struct {
	epoch time.Time
	items []heapItem
}

type heapItem struct {
	at int64 // key(ls.at)
	ls *Lease
}

func (h *leaseHeap) key(at time.Time) int64 { return int64(at.Sub(h.epoch)) }

// head returns the lease with the earliest deadline; the heap is not empty.
func (h *leaseHeap) head() *Lease { return h.items[0].ls }

func (h *leaseHeap) Len() int           { return len(h.items) }
func (h *leaseHeap) Less(i, j int) bool { return h.items[i].at < h.items[j].at }
func (h *leaseHeap) Swap(i, j int) {
	it := h.items
	it[i], it[j] = it[j], it[i]
	it[i].ls.idx, it[j].ls.idx = i, j
}
func (h *leaseHeap) Push(x any) {
	ls := x.(*Lease)
	ls.idx = len(h.items)
	h.items = append(h.items, heapItem{h.key(ls.at), ls})
}
func (h *leaseHeap) Pop() any {
	old := h.items
	ls := old[len(old)-1].ls
	old[len(old)-1] = heapItem{}
	ls.idx = -1
	h.items = old[:len(old)-1]
	return ls
}
