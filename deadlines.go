package leasehold

import (
	"errors"
	"log/slog"
	"time"
)

var errBatchLength = errors.New("leasehold: RenewBatch returned a wrong number of results")

// nextDeadline returns the lease's earliest pending deadline (zero: none).
// l.sched.mu held.
func (ls *Lease) nextDeadline() time.Time {
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if !ls.renewing {
		consider(ls.renewAt)
	}
	if !ls.guardOff {
		consider(ls.validUntil)
	}
	if !ls.capped {
		consider(ls.maxHoldAt)
	}
	return next
}

// due applies the deadlines that have passed at now, in order: maximum hold,
// local guard, renewal. It returns what to report and whether to renew now.
// l.sched.mu held.
func (ls *Lease) due(now time.Time, o *Options) (stepKind, bool) {
	if !ls.capped && !ls.maxHoldAt.IsZero() && !now.Before(ls.maxHoldAt) {
		ls.capped, ls.renewAt, ls.guardOff = true, time.Time{}, false
		return stepMaxHold, false
	}
	if !ls.guardOff && !ls.validUntil.IsZero() && !now.Before(ls.validUntil) {
		if ls.kind == renewed && !ls.capped && o.OnRenewFailure == RenewalContinue {
			ls.guardOff = true
			return stepContinue, false
		}
		return stepExpired, false
	}
	if !ls.renewing && !ls.renewAt.IsZero() && !now.Before(ls.renewAt) {
		ls.renewing = true
		return 0, true
	}
	return 0, false
}

// report makes the report of a step taken by the scheduler.
func (ls *Lease) report(what stepKind) {
	o := &ls.l.opts
	switch what {
	case stepMaxHold:
		ls.l.observe(Event{Kind: EventMaxHold, Key: ls.key, Fence: ls.fence})
		ls.log().WarnContext(ls.ctx, "leasehold: maximum hold time reached", slog.Duration("max_hold", o.MaxHold))
		ls.cancel(ErrMaxHoldReached)
	case stepContinue:
		ls.l.observe(Event{Kind: EventExpired, Key: ls.key, Fence: ls.fence})
		ls.log().WarnContext(ls.ctx, "leasehold: lease expired locally; continuing by policy", slog.Int("attempt", ls.failuresNow()))
	case stepExpired:
		if ls.kind == held || ls.ctx.Err() != nil { // the natural end of a hold, or of a capped lease
			ls.endReport(ErrLeaseExpired, 0)
			return
		}
		ls.log().ErrorContext(ls.ctx, "leasehold: lease expired locally", slog.Int("attempt", ls.failuresNow()))
		ls.endReport(ErrLeaseExpired, EventExpired)
	}
}

func (ls *Lease) failuresNow() int {
	s := ls.l.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	return ls.failures
}

// extend moves the local guard, if the lease has one, to sent+TTL−drift
// (never backward) and the next automatic renewal to sent+RenewInterval.
// l.sched.mu held.
func (ls *Lease) extend(sent time.Time, o *Options) {
	if ls.validUntil.IsZero() {
		return // no guard: a degraded lease that is renewed automatically
	}
	if until := sent.Add(ls.ttl - ls.drift); until.After(ls.validUntil) {
		ls.validUntil = until
		ls.guardOff = false
	}
	if ls.kind == renewed && !ls.degraded && !ls.capped {
		ls.renewAt = sent.Add(o.RenewInterval)
	}
}

// renewOutcome is what an automatic renewal's result does to its lease.
type renewOutcome struct {
	cause    error // non-nil: the lease ends with it
	failures int   // consecutive failures after this attempt
}

// outcome applies the result of an automatic renewal sent at sent and
// answered at now. l.sched.mu held.
func (ls *Lease) outcome(sent, now time.Time, err error, o *Options) renewOutcome {
	switch {
	case err == nil:
		ls.failures = 0
		ls.extend(sent, o)
		return renewOutcome{}
	case errors.Is(err, ErrNotOwned):
		return renewOutcome{cause: ErrLeaseLost}
	}
	ls.failures++
	if o.OnRenewFailure == RenewalFence && ls.failures >= o.MaxRenewFailures {
		return renewOutcome{cause: ErrLeaseAbandoned, failures: ls.failures}
	}
	ls.renewAt = now.Add(ls.retryGap(now, o))
	return renewOutcome{failures: ls.failures}
}

// retryGap spreads the attempts the failure budget has left over the time
// before the local guard: each may take RenewTimeout, and the gaps between
// them are equal, so the last one ends before the guard fires. The gap is
// at least MinRenewInterval and at most RenewInterval. When the attempts
// left cannot fit at all (the budget does not fit: New warned), retrying
// faster would only load the store, so the gap is RenewInterval.
// l.sched.mu held.
func (ls *Lease) retryGap(now time.Time, o *Options) time.Duration {
	left := o.MaxRenewFailures - ls.failures
	if o.OnRenewFailure == RenewalContinue || left < 1 || ls.guardOff {
		return o.RenewInterval
	}
	span := ls.validUntil.Sub(now) - time.Duration(left)*o.RenewTimeout
	if span < time.Duration(left)*MinRenewInterval {
		return o.RenewInterval
	}
	return min(max(span/time.Duration(left+1), MinRenewInterval), o.RenewInterval)
}

// reportRenewal reports the outcome of an automatic renewal sent at sent.
func (ls *Lease) reportRenewal(sent time.Time, err error, out renewOutcome) {
	switch {
	case err == nil:
		ls.l.observe(Event{Kind: EventRenewed, Key: ls.key, Fence: ls.fence, Duration: time.Since(sent)})
		return
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("renew")
		cause := lostCause(err)
		if cause == ErrLeaseLost {
			ls.log().ErrorContext(ls.ctx, "leasehold: lease lost")
		} else {
			ls.log().ErrorContext(ls.ctx, "leasehold: lease lost", slog.Any("error", err))
		}
		ls.endReport(cause, EventLost)
		return
	}
	ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "renew", Err: err})
	ls.l.observe(Event{Kind: EventRenewFailed, Key: ls.key, Fence: ls.fence, Attempt: out.failures, Err: err})
	ls.log().WarnContext(ls.ctx, "leasehold: lease renewal failed", slog.Int("attempt", out.failures), slog.Any("error", err))
	if out.cause != nil {
		ls.log().ErrorContext(ls.ctx, "leasehold: lease abandoned", slog.Int("attempt", out.failures), slog.Any("error", err))
		ls.l.observe(Event{Kind: EventAbandoned, Key: ls.key, Fence: ls.fence, Attempt: out.failures, Err: err})
		ls.endReport(ErrLeaseAbandoned, 0)
	}
}
