package prommetrics_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/prommetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one registry, one Observer and one memory store, with a recorder
// that lets tests wait for events instead of sleeping.
type env struct {
	t     *testing.T
	reg   *prometheus.Registry
	obs   *prommetrics.Observer
	store *memstore.Store

	mu    sync.Mutex
	seen  map[leasehold.EventKind]int
	wake  chan struct{}
	tee   leasehold.Observer
	quiet *slog.Logger
}

func newEnv(t *testing.T) *env {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := prommetrics.New(reg, prommetrics.Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e := &env{
		t: t, reg: reg, obs: obs, store: memstore.New(),
		seen: make(map[leasehold.EventKind]int), wake: make(chan struct{}, 1),
		quiet: slog.New(slog.DiscardHandler),
	}
	e.tee = leasehold.ObserverFunc(func(ev leasehold.Event) {
		obs.Observe(ev)
		e.mu.Lock()
		e.seen[ev.Kind]++
		e.mu.Unlock()
		select {
		case e.wake <- struct{}{}:
		default:
		}
	})
	return e
}

// locker returns a Locker named name over the env's store, closed in cleanup.
func (e *env) locker(name string, o leasehold.Options) *leasehold.Locker {
	e.t.Helper()
	o.Name = name
	o.Observer = e.tee
	if o.Logger == nil {
		o.Logger = e.quiet
	}
	l, err := leasehold.New(e.store, o)
	if err != nil {
		e.t.Fatalf("leasehold.New: %v", err)
	}
	e.t.Cleanup(func() { _ = l.Close() })
	return l
}

// waitEvents waits until at least n events of kind were observed.
func (e *env) waitEvents(kind leasehold.EventKind, n int) {
	e.t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		got := e.seen[kind]
		e.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-e.wake:
		case <-time.After(10 * time.Millisecond):
		case <-deadline.C:
			e.t.Fatalf("expected %d %v events within 10s, got %d", n, kind, got)
		}
	}
}

// waitDone waits for the lease's context to end and returns its cause.
func waitDone(t *testing.T, ls *leasehold.Lease) error {
	t.Helper()
	select {
	case <-ls.Done():
		return ls.Err()
	case <-time.After(10 * time.Second):
		t.Fatalf("lease on %q did not end within 10s", ls.Key())
		return nil
	}
}

// find returns the series of family name whose labels include pairs
// (name, value, name, value...), or nil.
func find(t *testing.T, g prometheus.Gatherer, name string, pairs ...string) *dto.Metric {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(pairs); i += 2 {
				if !hasLabel(m, pairs[i], pairs[i+1]) {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// counter returns the value of a counter series; it fails when the series
// does not exist.
func (e *env) counter(name string, pairs ...string) float64 {
	e.t.Helper()
	m := find(e.t, e.reg, name, pairs...)
	if m == nil || m.GetCounter() == nil {
		e.t.Fatalf("no counter %s%v", name, pairs)
	}
	return m.GetCounter().GetValue()
}

// hist returns the sample count and sum of a histogram series; it fails when
// the series does not exist.
func (e *env) hist(name string, pairs ...string) (uint64, float64) {
	e.t.Helper()
	m := find(e.t, e.reg, name, pairs...)
	if m == nil || m.GetHistogram() == nil {
		e.t.Fatalf("no histogram %s%v", name, pairs)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// wantCounter checks a counter's exact value.
func (e *env) wantCounter(want float64, name string, pairs ...string) {
	e.t.Helper()
	if got := e.counter(name, pairs...); got != want {
		e.t.Errorf("expected %s%v = %v, got %v", name, pairs, want, got)
	}
}

// wantCount checks a histogram's exact sample count.
func (e *env) wantCount(want uint64, name string, pairs ...string) {
	e.t.Helper()
	if got, _ := e.hist(name, pairs...); got != want {
		e.t.Errorf("expected %s%v sample count %d, got %d", name, pairs, want, got)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
