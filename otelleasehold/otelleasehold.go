package otelleasehold

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasehold/leasehold"
)

// ScopeName is the instrumentation scope of the tracer.
const ScopeName = "github.com/leasehold/leasehold/otelleasehold"

// Attribute keys set on every span.
const (
	AttrLocker  = attribute.Key("leasehold.locker")
	AttrKey     = attribute.Key("leasehold.key")
	AttrOutcome = attribute.Key("leasehold.outcome")
	AttrFence   = attribute.Key("leasehold.fence")
	AttrAttempt = attribute.Key("leasehold.attempt")
)

// Span names.
const (
	SpanAcquire = "leasehold.acquire"
	SpanWait    = "leasehold.wait"
	SpanRenew   = "leasehold.renew"
	SpanRelease = "leasehold.release"
	SpanLease   = "leasehold.lease"
)

// Observer is a leasehold.Observer that records spans. It is safe for
// concurrent use.
type Observer struct {
	tracer trace.Tracer
	now    func() time.Time

	mu      sync.Mutex
	waiting map[waitKey]time.Time // first contention of an acquire in progress
}

type waitKey struct{ locker, key string }

var _ leasehold.Observer = (*Observer)(nil)

// New returns an Observer whose spans go to tp; nil means the global
// provider (otel.GetTracerProvider).
func New(tp trace.TracerProvider) *Observer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Observer{
		tracer:  tp.Tracer(ScopeName),
		now:     time.Now,
		waiting: make(map[waitKey]time.Time),
	}
}

// Observe implements leasehold.Observer. Kinds it does not know are ignored.
func (o *Observer) Observe(e leasehold.Event) {
	now := o.now()
	switch e.Kind {
	case leasehold.EventContention:
		o.contended(e, now)
	case leasehold.EventAcquire:
		o.acquire(e, now)
	case leasehold.EventFailOpen:
		o.span(SpanAcquire, e, now, now, "fail_open", e.Err)
	case leasehold.EventRenewed:
		o.span(SpanRenew, e, now.Add(-e.Duration), now, "renewed", nil)
	case leasehold.EventRenewFailed:
		o.span(SpanRenew, e, now, now, "failed", e.Err, AttrAttempt.Int(e.Attempt))
	case leasehold.EventReleased:
		o.span(SpanRelease, e, now, now, "released", nil)
	case leasehold.EventNotOwned:
		if e.Op == "release" || e.Op == "renew" {
			o.span("leasehold."+e.Op, e, now, now, "not_owned", errNotOwned)
		}
	case leasehold.EventStoreError:
		if e.Op == "release" {
			o.span(SpanRelease, e, now, now, "error", e.Err)
		}
	case leasehold.EventHeld:
		reason := Reason(e.Err)
		var err error
		if reason != "released" && reason != "closed" {
			err = e.Err
		}
		o.span(SpanLease, e, now.Add(-e.Duration), now, reason, err)
	}
}

var errNotOwned = errors.New("lock not owned")

// contended remembers when an acquire first found another owner.
func (o *Observer) contended(e leasehold.Event, now time.Time) {
	k := waitKey{e.Locker, e.Key}
	o.mu.Lock()
	if _, ok := o.waiting[k]; !ok {
		o.waiting[k] = now
	}
	o.mu.Unlock()
}

// acquire records the acquire span and, when the call met another owner, its
// wait as a child.
func (o *Observer) acquire(e leasehold.Event, now time.Time) {
	k := waitKey{e.Locker, e.Key}
	o.mu.Lock()
	waitStart, waited := o.waiting[k]
	delete(o.waiting, k)
	o.mu.Unlock()

	var err error
	if e.Result == leasehold.ResultError {
		err = e.Err
	}
	start := now.Add(-e.Duration)
	ctx, span := o.tracer.Start(context.Background(), SpanAcquire, trace.WithTimestamp(start), trace.WithAttributes(attrs(e, e.Result)...))
	if waited && e.Result != leasehold.ResultError {
		if waitStart.Before(start) {
			waitStart = start
		}
		_, w := o.tracer.Start(ctx, SpanWait, trace.WithTimestamp(waitStart), trace.WithAttributes(attrs(e, e.Result)...))
		w.End(trace.WithTimestamp(now))
	}
	end(span, err, now)
}

// span records one span from start to stop.
func (o *Observer) span(name string, e leasehold.Event, start, stop time.Time, outcome string, err error, extra ...attribute.KeyValue) {
	_, s := o.tracer.Start(context.Background(), name, trace.WithTimestamp(start), trace.WithAttributes(append(attrs(e, outcome), extra...)...))
	end(s, err, stop)
}

func end(s trace.Span, err error, at time.Time) {
	if err != nil {
		s.RecordError(err, trace.WithTimestamp(at))
		s.SetStatus(codes.Error, err.Error())
	}
	s.End(trace.WithTimestamp(at))
}

func attrs(e leasehold.Event, outcome string) []attribute.KeyValue {
	a := []attribute.KeyValue{AttrLocker.String(e.Locker), AttrKey.String(e.Key), AttrOutcome.String(outcome)}
	if e.Fence != 0 {
		if e.Fence <= math.MaxInt64 {
			a = append(a, AttrFence.Int64(int64(e.Fence)))
		} else {
			a = append(a, AttrFence.String(strconv.FormatUint(e.Fence, 10)))
		}
	}
	return a
}

// reasons maps a lease's end cause to the outcome of its leasehold.lease span.
var reasons = []struct {
	err  error
	name string
}{
	{leasehold.ErrLeaseReleased, "released"}, {leasehold.ErrLeaseLost, "lost"},
	{leasehold.ErrLeaseAbandoned, "abandoned"}, {leasehold.ErrLeaseExpired, "expired"},
	{leasehold.ErrMaxHoldReached, "max_hold"}, {leasehold.ErrLockerClosed, "closed"},
}

// Reason returns the outcome of a lease that ended with cause err: released,
// lost, abandoned, expired, max_hold, closed or other.
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "other"
}
