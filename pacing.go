package leasehold

import (
	"log/slog"
	"time"
)

// Renewal pacing. Due renewals wait in the scheduler's pending queue, oldest
// first, and renewal goroutines send them, each taking up to maxBatch leases
// per store call and the next batch when its call returned. A renewal's
// timeout starts when it is sent, not when it fell due: a queued renewal
// spends the slack before its lease's guard, never its RenewTimeout.
// Renewals sent late move their lease's next renewal later, so a burst
// spreads itself over the renew interval.
//
// How many calls are in flight follows their round time: one more (up to
// maxRenewCalls) after a call that took less than a quarter of
// RenewTimeout, half as many (at least one) after one that took more than
// half of it. Calls that queue for the store's connections or its one
// thread instead of running side by side take longer the more are sent at
// once; the limit keeps each one well inside its timeout.
//
// When the store (or this process) serves fewer renewals than fall due, the
// queue grows and renewals are sent later and later. A renewal sent later
// than half its slack (the time between falling due and the last moment a
// call of RenewTimeout still ends before the guard) is reported, at most
// once per RenewInterval, as EventRenewalBehind and a warning: before a
// lease expires for it.

// maxRenewCalls bounds the renewal store calls in flight. Enough to keep a
// pipelining store busy (8 × 256 renewals in flight), few enough that they
// fit a connection pool (go-redis: 10 per CPU).
const maxRenewCalls = 8

// adjust moves the limit of calls in flight after a call that took d.
func (s *scheduler) adjust(d time.Duration) {
	t := s.l.opts.RenewTimeout
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case d > t/2:
		s.pace.limit = max(s.pace.limit/2, 1)
	case d < t/4:
		s.pace.limit = min(s.pace.limit+1, maxRenewCalls)
	}
}

// pace is what the scheduler knows about how late renewals are sent.
// Guarded by scheduler.mu.
type pace struct {
	limit    int       // renewal calls in flight at most: 1 to maxRenewCalls
	warned   time.Time // last EventRenewalBehind
	from     time.Time // start of the current rate window
	sent     int       // renewals sent since from
	lastRate float64   // renewals sent per second in the last full window
}

// behind is one report that renewals fall behind.
type behind struct {
	lag, slack    time.Duration
	waiting, held int
	rate          float64 // renewals sent per second
	inFlight      int
}

// queueRenewals queues the due leases (already marked renewing), retries
// after a failure first, and, when the store renews in batches, tops the
// last batch up with leases whose renewal falls due within RenewInterval/4:
// renewing them a little early is harmless and saves round trips. It
// returns how many renewal goroutines to start. s.mu held.
func (s *scheduler) queueRenewals(now time.Time, due []*Lease) int {
	if len(due) == 0 {
		return 0
	}
	var retries []*Lease
	for _, ls := range due {
		if ls.failures > 0 {
			retries = append(retries, ls)
		} else {
			s.pending = append(s.pending, ls)
		}
	}
	if retries != nil { // first: they have the least time left before their guard
		s.pending = append(retries, s.pending...)
	}
	if s.batch != nil {
		s.topUp(now.Add(s.l.opts.RenewInterval / 4))
	}
	n := max(min(s.pace.limit-s.calls, (len(s.pending)+maxBatch-1)/maxBatch), 0)
	s.calls += n
	return n
}

// topUp moves leases from the head of the heap to the pending queue until
// its last batch is full, as long as the head's next deadline is a renewal
// due by soon (a lease retrying after a failure keeps its own schedule).
// s.mu held.
func (s *scheduler) topUp(soon time.Time) {
	for len(s.pending)%maxBatch != 0 && s.q.Len() > 0 {
		ls := s.q.head()
		if ls.at.After(soon) || !ls.at.Equal(ls.renewAt) || ls.renewing || ls.failures > 0 || !ls.ops.batchable() {
			return
		}
		ls.renewing = true
		s.fix(ls) // now at its guard, or out of the heap
		s.pending = append(s.pending, ls)
	}
}

// renewer is a renewal goroutine: it sends queued renewals a batch at a time
// until none is left.
func (s *scheduler) renewer() {
	defer s.wg.Done()
	for {
		r, late, ok := s.take()
		if !ok {
			return
		}
		if late != nil {
			s.reportBehind(*late)
		}
		s.renew(r)
		s.adjust(time.Since(r.sent))
	}
}

// take takes the next batch from the pending queue, skipping leases that
// ended, or passed their guard, while they waited. It reports false, and
// counts this goroutine out, when nothing is left, Close began or more
// calls are in flight than the limit; and a report when renewals fall
// behind.
func (s *scheduler) take() (renewal, *behind, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls > s.pace.limit {
		s.calls--
		return renewal{}, nil, false
	}
	now := time.Now()
	fence := s.l.opts.OnRenewFailure == RenewalFence
	var b []*Lease
	for len(s.pending) > 0 && len(b) < maxBatch {
		ls := s.pending[0]
		s.pending[0] = nil
		s.pending = s.pending[1:]
		// Past its guard a fenced lease is over (the loop ends it at its
		// next pass): a renewal now could only find it lost.
		pastGuard := fence && !ls.validUntil.IsZero() && !now.Before(ls.validUntil)
		if !ls.over && !s.closed && !pastGuard {
			b = append(b, ls)
		}
	}
	if len(s.pending) == 0 {
		s.pending = nil
	}
	if len(b) == 0 {
		s.calls--
		return renewal{}, nil, false
	}
	return renewal{leases: b, sent: now}, s.paced(now, b), true
}

// paced counts a batch sent at now and returns a report when its oldest
// first-attempt renewal is later than half its slack and none was made in
// the last RenewInterval. s.mu held.
func (s *scheduler) paced(now time.Time, b []*Lease) *behind {
	o := &s.l.opts
	switch {
	case s.pace.from.IsZero():
		s.pace.from = now
	case now.Sub(s.pace.from) >= o.RenewInterval:
		s.pace.lastRate = float64(s.pace.sent) / now.Sub(s.pace.from).Seconds()
		s.pace.from, s.pace.sent = now, 0
	}
	s.pace.sent += len(b)
	for _, ls := range b {
		if ls.failures > 0 || ls.renewAt.IsZero() || ls.validUntil.IsZero() {
			continue
		}
		lag, slack := now.Sub(ls.renewAt), ls.validUntil.Sub(ls.renewAt)-o.RenewTimeout
		if lag <= slack/2 || slack <= 0 || (!s.pace.warned.IsZero() && now.Sub(s.pace.warned) < o.RenewInterval) {
			return nil
		}
		s.pace.warned = now
		return &behind{lag: lag, slack: slack, waiting: len(s.pending), held: len(s.leases),
			rate: s.pace.lastRate, inFlight: s.calls}
	}
	return nil
}

// reportBehind says that renewals fall behind what the leases demand.
func (s *scheduler) reportBehind(b behind) {
	o := &s.l.opts
	s.l.observe(Event{Kind: EventRenewalBehind, Op: "renew", Duration: b.lag, Attempt: b.waiting})
	o.Logger.Warn("leasehold: renewals fall behind; leases will expire if this lasts",
		slog.String("locker", o.Name), slog.Int("leases", b.held),
		slog.Float64("due_per_sec", float64(b.held)/o.RenewInterval.Seconds()),
		slog.Float64("sent_per_sec", b.rate), slog.Duration("lag", b.lag), slog.Duration("slack", b.slack),
		slog.Int("waiting", b.waiting), slog.Int("calls_in_flight", b.inFlight))
}
