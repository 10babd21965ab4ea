package leasehold_test

import (
	"bytes"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []leasehold.Event
}

func (r *recorder) Observe(e leasehold.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) count(kind leasehold.EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

func (r *recorder) find(kind leasehold.EventKind) []leasehold.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []leasehold.Event
	for _, e := range r.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) count(substr string) int { return strings.Count(s.String(), substr) }

// fakeClock is a settable clock for memstore expiry.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// opCounter counts store calls per operation through memstore's fault hook
// and applies fail to decide faults.
type opCounter struct {
	mu   sync.Mutex
	n    map[memstore.Op]int
	fail func(op memstore.Op, key string) memstore.Fault
}

func countOps(s *memstore.Store, fail func(op memstore.Op, key string) memstore.Fault) *opCounter {
	c := &opCounter{n: map[memstore.Op]int{}, fail: fail}
	s.SetFaults(func(op memstore.Op, key string) memstore.Fault {
		c.mu.Lock()
		c.n[op]++
		f := c.fail
		c.mu.Unlock()
		if f != nil {
			return f(op, key)
		}
		return memstore.Fault{}
	})
	return c
}

func (c *opCounter) get(op memstore.Op) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

func (c *opCounter) setFail(f func(op memstore.Op, key string) memstore.Fault) {
	c.mu.Lock()
	c.fail = f
	c.mu.Unlock()
}

// newLocker builds a Locker over store with a test logger, closed at cleanup.
func newLocker(t *testing.T, store driver.Store, o leasehold.Options) (*leasehold.Locker, *recorder, *syncBuffer) {
	t.Helper()
	rec := &recorder{}
	logs := &syncBuffer{}
	if o.Observer == nil {
		o.Observer = rec
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	l, err := leasehold.New(store, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, rec, logs
}

func waitDone(t *testing.T, ctx interface{ Done() <-chan struct{} }, limit time.Duration, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(limit):
		t.Fatalf("%s: not done after %v", what, limit)
	}
}

func slogTo(w *syncBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// countGoroutines returns the number of goroutines running code of package
// leasehold (a scheduler, a renewal, a clean-up), whatever else the process
// runs.
func countGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/leasehold/leasehold.(*") {
			count++
		}
	}
	return count
}

func itoa(i int) string { return strconv.Itoa(i) }
