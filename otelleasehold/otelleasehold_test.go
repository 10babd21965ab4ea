package otelleasehold_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/otelleasehold"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a memory store and a span recorder behind an Observer.
type env struct {
	t     *testing.T
	store *memstore.Store
	rec   *tracetest.SpanRecorder
	obs   *otelleasehold.Observer
}

func newEnv(t *testing.T) *env {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return &env{t: t, store: memstore.New(), rec: rec, obs: otelleasehold.New(tp)}
}

func (e *env) locker(name string, o leasehold.Options) *leasehold.Locker {
	e.t.Helper()
	o.Name, o.Observer, o.Logger = name, e.obs, slog.New(slog.DiscardHandler)
	l, err := leasehold.New(e.store, o)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = l.Close() })
	return l
}

// spans returns the ended spans named name with outcome (any when "").
func (e *env) spans(name, outcome string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.rec.Ended() {
		if s.Name() == name && (outcome == "" || attr(s, otelleasehold.AttrOutcome).AsString() == outcome) {
			out = append(out, s)
		}
	}
	return out
}

// waitSpan waits up to 10 s for a span named name with outcome.
func (e *env) waitSpan(name, outcome string) sdktrace.ReadOnlySpan {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s := e.spans(name, outcome); len(s) > 0 {
			return s[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("no %s span with outcome %q within 10s; spans: %v", name, outcome, names(e.rec.Ended()))
	return nil
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var n []string
	for _, s := range spans {
		n = append(n, s.Name()+"/"+attr(s, otelleasehold.AttrOutcome).AsString())
	}
	return n
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, locker, key string, fence uint64) {
	t.Helper()
	if got := attr(s, otelleasehold.AttrLocker).AsString(); got != locker {
		t.Errorf("%s: expected locker %q, got %q", s.Name(), locker, got)
	}
	if got := attr(s, otelleasehold.AttrKey).AsString(); got != key {
		t.Errorf("%s: expected key %q, got %q", s.Name(), key, got)
	}
	if got := attr(s, otelleasehold.AttrFence).AsInt64(); uint64(got) != fence {
		t.Errorf("%s: expected fence %d, got %d", s.Name(), fence, got)
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	e := newEnv(t)
	l := e.locker("approval", leasehold.Options{TTL: 300 * time.Millisecond, RenewInterval: 30 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "invoice/7")
	if err != nil {
		t.Fatal(err)
	}
	fence := lease.Fence()
	renew := e.waitSpan(otelleasehold.SpanRenew, "renewed")
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	acq := e.waitSpan(otelleasehold.SpanAcquire, leasehold.ResultAcquired)
	rel := e.waitSpan(otelleasehold.SpanRelease, "released")
	whole := e.waitSpan(otelleasehold.SpanLease, "released")
	for _, s := range []sdktrace.ReadOnlySpan{acq, renew, rel, whole} {
		wantAttrs(t, s, "approval", "invoice/7", fence)
		if s.Status().Code == codes.Error {
			t.Errorf("%s: expected no error status, got %v", s.Name(), s.Status())
		}
		if s.Parent().IsValid() {
			t.Errorf("%s: expected a root span", s.Name())
		}
	}
	if !renew.EndTime().After(renew.StartTime()) {
		t.Errorf("renew span should last its round trip: %v to %v", renew.StartTime(), renew.EndTime())
	}
	if whole.StartTime().After(renew.StartTime()) || whole.EndTime().Before(rel.EndTime()) {
		t.Errorf("the lease span [%v, %v] should cover the renewal and the release", whole.StartTime(), whole.EndTime())
	}
	if n := len(e.spans(otelleasehold.SpanWait, "")); n != 0 {
		t.Errorf("an uncontended acquire should have no wait span, got %d", n)
	}
}

func TestWaitIsAChildOfAcquire(t *testing.T) {
	e := newEnv(t)
	a := e.locker("workflow", leasehold.Options{})
	b := e.locker("workflow", leasehold.Options{})
	held, err := a.TryAcquire(t.Context(), "run/1")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(60*time.Millisecond, func() { _ = held.Release(t.Context()) })
	lease, err := b.Acquire(t.Context(), "run/1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(t.Context()) }()
	var acq sdktrace.ReadOnlySpan
	for _, s := range e.spans(otelleasehold.SpanAcquire, leasehold.ResultAcquired) {
		if attr(s, otelleasehold.AttrFence).AsInt64() == int64(lease.Fence()) {
			acq = s
		}
	}
	if acq == nil {
		t.Fatalf("no acquire span with fence %d: %v", lease.Fence(), names(e.rec.Ended()))
	}
	waits := e.spans(otelleasehold.SpanWait, leasehold.ResultAcquired)
	if len(waits) != 1 {
		t.Fatalf("expected one wait span, got %v", names(e.rec.Ended()))
	}
	w := waits[0]
	if w.Parent().SpanID() != acq.SpanContext().SpanID() || w.SpanContext().TraceID() != acq.SpanContext().TraceID() {
		t.Errorf("the wait span's parent should be the acquire span")
	}
	if w.StartTime().Before(acq.StartTime()) || !w.EndTime().Equal(acq.EndTime()) {
		t.Errorf("wait [%v, %v] should lie inside acquire [%v, %v] and end with it", w.StartTime(), w.EndTime(), acq.StartTime(), acq.EndTime())
	}
	if d := w.EndTime().Sub(w.StartTime()); d < 30*time.Millisecond {
		t.Errorf("expected the wait to last about the 60ms the holder kept the key, got %v", d)
	}
	wantAttrs(t, w, "workflow", "run/1", lease.Fence())
}

func TestLostLeaseAndNotOwnedRenewal(t *testing.T) {
	e := newEnv(t)
	l := e.locker("reconciler", leasehold.Options{TTL: 300 * time.Millisecond, RenewInterval: 30 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "reconcile/default")
	if err != nil {
		t.Fatal(err)
	}
	e.store.Restart() // the store forgets the lock: the next renewal is answered "not owned"
	<-lease.Done()
	whole := e.waitSpan(otelleasehold.SpanLease, "lost")
	renew := e.waitSpan(otelleasehold.SpanRenew, "not_owned")
	for _, s := range []sdktrace.ReadOnlySpan{whole, renew} {
		wantAttrs(t, s, "reconciler", "reconcile/default", lease.Fence())
		if s.Status().Code != codes.Error {
			t.Errorf("%s/%s: expected an error status, got %v", s.Name(), attr(s, otelleasehold.AttrOutcome).AsString(), s.Status())
		}
	}
}

func TestStoreErrorAndFailOpen(t *testing.T) {
	e := newEnv(t)
	closed := e.locker("approval", leasehold.Options{})
	open := e.locker("cleanup", leasehold.Options{OnStoreError: leasehold.FailOpen})
	e.store.SetDown(true)
	if _, err := closed.TryAcquire(t.Context(), "a"); err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected a store error, got %v", err)
	}
	lease, err := open.TryAcquire(t.Context(), "b")
	if err != nil {
		t.Fatalf("expected a degraded lease, got %v", err)
	}
	_ = lease.Release(t.Context())
	e.store.SetDown(false)
	errs := e.spans(otelleasehold.SpanAcquire, leasehold.ResultError)
	if len(errs) != 2 {
		t.Fatalf("expected 2 acquire spans with outcome error, got %v", names(e.rec.Ended()))
	}
	for _, s := range errs {
		if s.Status().Code != codes.Error || len(s.Events()) == 0 {
			t.Errorf("acquire error span: expected an error status and a recorded error, got %v and %d events", s.Status(), len(s.Events()))
		}
	}
	fo := e.waitSpan(otelleasehold.SpanAcquire, "fail_open")
	if got := attr(fo, otelleasehold.AttrLocker).AsString(); got != "cleanup" {
		t.Errorf("fail_open span: expected locker cleanup, got %q", got)
	}
}

func TestReason(t *testing.T) {
	for err, want := range map[error]string{
		leasehold.ErrLeaseReleased: "released", leasehold.ErrLeaseLost: "lost",
		leasehold.ErrLeaseAbandoned: "abandoned", leasehold.ErrLeaseExpired: "expired",
		leasehold.ErrMaxHoldReached: "max_hold", leasehold.ErrLockerClosed: "closed",
		errors.New("x"): "other", nil: "other",
	} {
		if got := otelleasehold.Reason(err); got != want {
			t.Errorf("Reason(%v) = %q, want %q", err, got, want)
		}
	}
}
