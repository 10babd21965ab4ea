package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// TestReleaseAllScale (issue 33 item 3) holds K keys with one Locker over
// its own pool, queues one waiter per key from a second Locker over another
// pool, then releases all K leases at once from K goroutines. It logs the
// release errors (with their text), the time from the release-all until
// each waiter has its key (p50, max), PostgreSQL's CPU (the postmaster and
// its backends, from /proc) and the load average. It fails only on a
// release error or a waiter that never got its key: timings are logged,
// never asserted. Run it with LEASEHOLD_PG_RELEASEALL=1000,10000.
func TestReleaseAllScale(t *testing.T) {
	env := os.Getenv("LEASEHOLD_PG_RELEASEALL")
	if env == "" {
		t.Skip("set LEASEHOLD_PG_RELEASEALL=K[,K...] to run")
	}
	srv := testpg.Start(t)
	for _, f := range strings.Split(env, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			t.Fatalf("LEASEHOLD_PG_RELEASEALL: bad K %q", f)
		}
		t.Run(fmt.Sprintf("K=%d", k), func(t *testing.T) { releaseAll(t, srv, k) })
	}
}

func releaseAll(t *testing.T, srv *testpg.Server, k int) {
	dsn := srv.CreateDatabase(t)
	newLocker := func(name string) (*leasehold.Locker, *pgxpool.Pool) {
		pool := testpg.Connect(t, dsn, pgxpool.New)
		s, err := pgstore.New(t.Context(), pool, pgstore.Options{Migrate: pgstore.MigrateCreate})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		lk, err := leasehold.New(s, leasehold.Options{Name: name, TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		return lk, pool
	}
	holder, pool := newLocker("holder")
	waiter, wpool := newLocker("waiter")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	key := func(i int) string { return fmt.Sprintf("releaseall:%d", i) }
	leases := make([]*leasehold.Lease, k)
	inParallel(k, 8, func(i int) {
		l, err := holder.TryAcquire(ctx, key(i))
		if err != nil {
			t.Errorf("acquire %s: %v", key(i), err)
		}
		leases[i] = l
	})
	if t.Failed() {
		return
	}

	var (
		start   = make(chan struct{})
		t0      time.Time
		got     = make([]time.Duration, k)
		waiters sync.WaitGroup
	)
	for i := range k {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			l, err := waiter.Acquire(ctx, key(i))
			if err != nil {
				t.Errorf("waiter %s: %v", key(i), err)
				return
			}
			<-start
			got[i] = time.Since(t0)
			_ = l.Release(context.Background())
		}()
	}
	queued := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(srv.Query(dbName(t, dsn), "SELECT count(*) FROM leasehold_locks_waiters WHERE queued")))
		return n
	}
	for queued() < k {
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d waiters queued", queued(), k)
		}
		time.Sleep(100 * time.Millisecond)
	}
	postmaster := postmasterPID(t, srv)
	idle0, w0 := treeCPU(t, postmaster), wpool.Stat()
	time.Sleep(2 * time.Second) // every waiter is now idle, refreshing its place
	w := wpool.Stat()
	t.Logf("K=%d idle waiters: PostgreSQL CPU %.0f %% of a core; the waiters' pool served %d statements/s, each waited %v for a connection on average",
		k, (treeCPU(t, postmaster)-idle0)/2*100, (w.AcquireCount()-w0.AcquireCount())/2,
		((w.AcquireDuration() - w0.AcquireDuration()) / time.Duration(max(1, w.AcquireCount()-w0.AcquireCount()))).Round(time.Microsecond))

	cpu0, load0, st0 := treeCPU(t, postmaster), loadAvg(), pool.Stat()
	var (
		mu   sync.Mutex
		errs = map[string]int{}
		bad  int
		rel  sync.WaitGroup
	)
	for _, l := range leases {
		rel.Add(1)
		go func() {
			defer rel.Done()
			<-start
			if err := l.Release(context.Background()); err != nil {
				mu.Lock()
				errs[strings.ReplaceAll(err.Error(), l.Key(), "KEY")]++
				bad++
				mu.Unlock()
			}
		}()
	}
	t0 = time.Now()
	close(start)
	rel.Wait()
	released := time.Since(t0)
	st := pool.Stat()
	waiters.Wait()
	cpu := treeCPU(t, postmaster) - cpu0
	slices.Sort(got)
	t.Logf("K=%d: release errors %d, all releases returned in %v; time to key p50 %v, max %v; PostgreSQL CPU %.2f s; load %s -> %s",
		k, bad, released.Round(time.Millisecond), got[k/2].Round(time.Millisecond), got[k-1].Round(time.Millisecond), cpu, load0, loadAvg())
	t.Logf("  holder's pool: %d connections; during the release-all %d acquires, %d waited for a connection, %d gave up waiting, %v spent waiting",
		st.MaxConns(), st.AcquireCount()-st0.AcquireCount(), st.EmptyAcquireCount()-st0.EmptyAcquireCount(),
		st.CanceledAcquireCount()-st0.CanceledAcquireCount(), (st.AcquireDuration() - st0.AcquireDuration()).Round(time.Millisecond))
	for text, n := range errs {
		t.Logf("  %d x %s", n, text)
	}
	if bad > 0 {
		t.Errorf("expected 0 release errors, got %d", bad)
	}
}

// inParallel runs f(0..n-1) on g goroutines.
func inParallel(n, g int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// postmasterPID returns the server's postmaster: the parent of a backend.
func postmasterPID(t *testing.T, srv *testpg.Server) int {
	t.Helper()
	conn := testpg.Connect(t, srv.DSN(), pgxpool.New)
	var backend int
	if err := conn.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	return procStat(t, backend).ppid
}

// treeCPU returns the CPU seconds of pid and of its children, live (utime,
// stime) and reaped (its cutime, cstime).
func treeCPU(t *testing.T, pid int) float64 {
	t.Helper()
	st := procStat(t, pid)
	total := st.cpu + st.children
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); err == nil {
			if c, ok := parseStat(string(raw)); ok && c.ppid == pid {
				total += c.cpu
			}
		}
	}
	return total
}

type stat struct {
	ppid          int
	cpu, children float64 // seconds
}

func procStat(t *testing.T, pid int) stat {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	st, ok := parseStat(string(raw))
	if !ok {
		t.Fatalf("bad /proc/%d/stat: %q", pid, raw)
	}
	return st
}

// parseStat reads /proc/PID/stat: after the command, field 4 is the parent
// and 14-17 utime, stime, cutime and cstime in USER_HZ (100).
func parseStat(s string) (stat, bool) {
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return stat{}, false
	}
	var n [4]float64
	for i := range n {
		v, err := strconv.ParseFloat(f[11+i], 64)
		if err != nil {
			return stat{}, false
		}
		n[i] = v
	}
	ppid, err := strconv.Atoi(f[1])
	return stat{ppid: ppid, cpu: (n[0] + n[1]) / 100, children: (n[2] + n[3]) / 100}, err == nil
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}
