package benchkit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// The flags of every store's BenchmarkScale.
var (
	scaleLeases = flag.String("scale.leases", "1000,10000", "BenchmarkScale: comma-separated numbers of held leases")
	ScaleTTL    = flag.Duration("scale.ttl", 2*time.Second, "BenchmarkScale: lease TTL")
	scaleHold   = flag.Duration("scale.hold", 10*time.Second, "BenchmarkScale: how long the leases are held")
	scaleWait   = flag.Int("scale.waiters", 0, "BenchmarkScale: idle waiters (Acquire on held keys, one more Locker)")
	scaleLocks  = flag.Int("scale.lockers", 1, "BenchmarkScale: Lockers sharing the held leases")
	scaleSettle = flag.Duration("scale.settle", 2*time.Second, "BenchmarkScale: how long the waiters get to queue before the hold is measured")
)

// ScaleRuns returns one ScaleConfig per -scale.leases value, with the
// flags' waiters, Lockers and hold time; the caller sets the store's fields
// and runs each as b.Run(cfg.Name(), ...).
func ScaleRuns(b *testing.B) []ScaleConfig {
	var out []ScaleConfig
	for _, f := range strings.Split(*scaleLeases, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("bad -scale.leases %q", *scaleLeases)
		}
		out = append(out, ScaleConfig{Leases: n, Waiters: min(*scaleWait, n), Lockers: *scaleLocks, Hold: *scaleHold})
	}
	return out
}

// Name is the sub-benchmark's name: N=leases/K=waiters/P=Lockers.
func (c ScaleConfig) Name() string {
	return fmt.Sprintf("N=%d/K=%d/P=%d", c.Leases, *scaleWait, c.Lockers)
}

// ScaleConfig is one scale run: Lockers Lockers holding Leases leases
// between them for Hold, while Waiters goroutines of one more Locker wait
// in Acquire for the first Waiters keys.
type ScaleConfig struct {
	Leases  int           // held leases, each on its own key
	Waiters int           // idle waiters, at most Leases
	Lockers int           // Lockers sharing the held leases; 0 means 1
	Hold    time.Duration // how long they are held after the last was acquired
	// ServerPID is the store server's process, whose CPU is read from
	// /proc/PID/stat, with its children's (PostgreSQL's backends); 0: not
	// measured.
	ServerPID int
	// Requests returns the store requests sent so far (a pipeline counts
	// each command); nil: not measured.
	Requests func() int64
	// NewWaiterLocker builds the waiters' Locker, as another process's
	// (its own client); nil: the Lockers' constructor.
	NewWaiterLocker func() (*leasehold.Locker, error)
}

// ScaleResult is what a scale run measured. CPU is in cores (1 = one core
// busy for the whole hold), rates per second of the hold.
type ScaleResult struct {
	HeapPerLease               float64 // bytes of Go heap per held lease
	HeapPerWaiter              float64 // bytes of Go heap per waiting Acquire
	Requests, Renewals         float64 // per second
	ClientCPU, ServerCPU       float64
	Expired, Lost, Abandoned   int // leases that ended, by cause
	Other, RenewFailed, Errors int // other ends; failed renewals; store errors
	Behind                     int // "renewal_behind" events
	// FirstBehind and FirstEnd are when the first "renewal_behind" event
	// and the first lease's end ("held") came, since the first acquire
	// (-1: none).
	FirstBehind, FirstEnd time.Duration
	Load                  string
}

// Scale acquires cfg.Leases keys with TryAcquire from cfg.Lockers Lockers
// that newLocker builds around the observer it is given, starts the
// waiters, holds the keys for cfg.Hold and reports what it cost and what
// was lost. It closes the Lockers.
func Scale(b *testing.B, cfg ScaleConfig, newLocker func(leasehold.Observer) (*leasehold.Locker, error)) ScaleResult {
	b.Helper()
	var ev eventCounts
	lockers := make([]*leasehold.Locker, max(cfg.Lockers, 1))
	for i := range lockers {
		l, err := newLocker(&ev)
		if err != nil {
			b.Fatal(err)
		}
		lockers[i] = l
	}
	r := ScaleResult{Load: loadAvg()}
	heap0, t0 := heapNow(), time.Now()
	leases := acquireAll(b, lockers, cfg.Leases)
	heap1 := heapNow()
	r.HeapPerLease = float64(heap1-heap0) / float64(cfg.Leases)
	newWaiter := cfg.NewWaiterLocker
	if newWaiter == nil {
		newWaiter = func() (*leasehold.Locker, error) { return newLocker(nil) }
	}
	stopWaiters := startWaiters(b, cfg.Waiters, newWaiter)
	if cfg.Waiters > 0 {
		time.Sleep(*scaleSettle) // every waiter queued
		r.HeapPerWaiter = float64(heapNow()-heap1) / float64(cfg.Waiters)
	}
	self, req0, ren0 := cpuOf(b, os.Getpid()), requests(cfg), ev.get("renewed")
	srv := treeCPU(b, cfg.ServerPID)
	start := time.Now()
	time.Sleep(cfg.Hold)
	secs := time.Since(start).Seconds()
	r.ClientCPU = (cpuOf(b, os.Getpid()) - self) / secs
	r.ServerCPU = (treeCPU(b, cfg.ServerPID) - srv) / secs
	r.Requests = float64(requests(cfg)-req0) / secs
	r.Renewals = float64(ev.get("renewed")-ren0) / secs
	r.count(leases)
	r.RenewFailed, r.Errors, r.Behind = ev.get("renew_failed"), ev.get("store_error"), ev.get("renewal_behind")
	r.FirstBehind, r.FirstEnd = ev.firstAt("renewal_behind", t0), ev.firstAt("held", t0)
	r.Load += " -> " + loadAvg()
	stopWaiters()
	for _, l := range lockers {
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// count counts the leases that ended, by cause.
func (r *ScaleResult) count(leases []*leasehold.Lease) {
	for _, ls := range leases {
		switch err := ls.Err(); {
		case err == nil:
		case errors.Is(err, leasehold.ErrLeaseExpired):
			r.Expired++
		case errors.Is(err, leasehold.ErrLeaseLost):
			r.Lost++
		case errors.Is(err, leasehold.ErrLeaseAbandoned):
			r.Abandoned++
		default:
			r.Other++
		}
	}
}

// startWaiters starts n goroutines waiting in Acquire for keys 0..n-1 on a
// Locker of their own; the returned func stops and joins them and closes
// it. A waiter that gets its key (it expired) counts as a store error.
func startWaiters(b *testing.B, n int, newLocker func() (*leasehold.Locker, error)) (stop func()) {
	if n == 0 {
		return func() {}
	}
	l, err := newLocker()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ls, err := l.Acquire(ctx, "scale:"+strconv.Itoa(i)); err == nil {
				_ = ls.Release(ctx)
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// Report reports r as benchmark metrics and logs it in one line.
func (r ScaleResult) Report(b *testing.B) {
	b.Helper()
	b.ReportMetric(r.HeapPerLease, "heap-B/lease")
	if r.HeapPerWaiter != 0 {
		b.ReportMetric(r.HeapPerWaiter, "heap-B/waiter")
	}
	b.ReportMetric(r.Requests, "requests/s")
	b.ReportMetric(r.Renewals, "renewals/s")
	b.ReportMetric(r.ClientCPU, "client-cores")
	b.ReportMetric(r.ServerCPU, "server-cores")
	b.ReportMetric(float64(r.Expired+r.Lost+r.Abandoned+r.Other), "ended")
	b.ReportMetric(float64(r.Behind), "behind")
	b.Logf("heap %.0f B/lease (%.0f B/waiter), %.0f requests/s, %.0f renewals/s, client %.1f%% / server %.1f%% of a core; "+
		"expired %d, lost %d, abandoned %d, other %d; renew failures %d, store errors %d, behind %d (first at %v, first end at %v); load %s",
		r.HeapPerLease, r.HeapPerWaiter, r.Requests, r.Renewals, 100*r.ClientCPU, 100*r.ServerCPU,
		r.Expired, r.Lost, r.Abandoned, r.Other, r.RenewFailed, r.Errors, r.Behind, r.FirstBehind, r.FirstEnd, r.Load)
}

// acquireAll takes n keys with 32 goroutines, key i from lockers[i%len].
func acquireAll(b *testing.B, lockers []*leasehold.Locker, n int) []*leasehold.Lease {
	out := make([]*leasehold.Lease, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				ls, err := lockers[i%len(lockers)].TryAcquire(context.Background(), "scale:"+strconv.Itoa(i))
				if err != nil {
					errc <- fmt.Errorf("acquire %d: %w", i, err)
					return
				}
				out[i] = ls
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		b.Fatal(err)
	}
	return out
}

func heapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func requests(cfg ScaleConfig) int64 {
	if cfg.Requests == nil {
		return 0
	}
	return cfg.Requests()
}

// cpuOf returns the user+system CPU seconds of process pid so far, from
// /proc/PID/stat (0 for pid 0).
func cpuOf(b *testing.B, pid int) float64 {
	if pid == 0 {
		return 0
	}
	f, err := statFields(pid)
	if err != nil {
		b.Fatal(err)
	}
	return f.cpu
}

// treeCPU returns cpuOf(pid) plus the CPU of its children: the live ones'
// and, through cutime and cstime, the ones it reaped.
func treeCPU(b *testing.B, pid int) float64 {
	if pid == 0 {
		return 0
	}
	f, err := statFields(pid)
	if err != nil {
		b.Fatal(err)
	}
	total := f.cpu + f.children
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if c, err := statFields(child); err == nil && c.ppid == pid {
			total += c.cpu
		}
	}
	return total
}

// ParentOf returns the parent process of pid (PostgreSQL: a backend's
// postmaster).
func ParentOf(b *testing.B, pid int) int {
	f, err := statFields(pid)
	if err != nil {
		b.Fatal(err)
	}
	return f.ppid
}

type procStat struct {
	ppid          int
	cpu, children float64 // seconds: utime+stime, cutime+cstime
}

// statFields reads /proc/PID/stat: after the command (which may hold
// spaces), field 3 is the state, 4 the parent, 14-17 utime, stime, cutime
// and cstime in USER_HZ (100 on Linux).
func statFields(pid int) (procStat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var n [4]float64
	for i := range n {
		if n[i], err = strconv.ParseFloat(f[11+i], 64); err != nil {
			return procStat{}, fmt.Errorf("bad /proc/%d/stat: %q", pid, s)
		}
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("bad /proc/%d/stat: %q", pid, s)
	}
	return procStat{ppid: ppid, cpu: (n[0] + n[1]) / 100, children: (n[2] + n[3]) / 100}, nil
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}

// eventCounts counts events by kind, read by name (not by constant, so
// that the run builds against versions without a kind).
// It keeps the time of each kind's first event.
type eventCounts struct {
	n     [64]atomic.Int64
	first [64]atomic.Int64 // Unix ns
}

func (e *eventCounts) Observe(ev leasehold.Event) {
	if k := int(ev.Kind); k >= 0 && k < len(e.n) {
		if e.n[k].Add(1) == 1 {
			e.first[k].Store(time.Now().UnixNano())
		}
	}
}

func (e *eventCounts) index(kind string) int {
	for k := range e.n {
		if leasehold.EventKind(k).String() == kind {
			return k
		}
	}
	return 0
}

func (e *eventCounts) get(kind string) int { return int(e.n[e.index(kind)].Load()) }

// firstAt returns when the first event of kind came, relative to t0 (-1: none).
func (e *eventCounts) firstAt(kind string, t0 time.Time) time.Duration {
	ns := e.first[e.index(kind)].Load()
	if ns == 0 {
		return -1
	}
	return time.Unix(0, ns).Sub(t0)
}
