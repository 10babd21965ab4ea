package etcdstore_test

// Benchmarks of the store beside etcd's own concurrency.Mutex (the baseline
// etcd users have), in the same run, on one embedded etcd member over
// loopback (fsync off: raft entries are reported instead, one WAL write
// each). Every replica has its own client, whose requests are counted at
// gRPC (unary calls and stream messages: watch creates and cancels,
// keep-alives).
//
//	go test -run '^$' -bench . -benchtime 1x -count 3 ./etcdstore
//
// Each implementation runs as "mutex" (concurrency.Mutex on one Session per
// replica), "store" (the Store with the minimal waiting loop below) and
// "locker" (a leasehold.Locker over the Store: rerun after the Locker's
// queue-aware waiting lands to measure it).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// replica is one process contending for locks.
type replica interface {
	// lock waits until key is held (ttl) and returns its unlock.
	lock(ctx context.Context, key string, ttl time.Duration) (unlock func(context.Context) error, err error)
	// lockKey is the etcd key (or key prefix) whose deletion frees key.
	lockKey(key string) string
	// crash stops the replica without releasing what it holds.
	crash()
	close()
}

type impl struct {
	name string
	new  func(b *testing.B, c *testetcd.Cluster, ttl time.Duration) (replica, *calls)
}

var impls = []impl{
	{"mutex", newMutexReplica},
	{"store", newStoreReplica},
	{"locker", newLockerReplica},
}

const benchPrefix = "lh-bench/"

// mutexReplica is etcd's own lock: one Session (lease kept alive) per
// process, a Mutex per key.
type mutexReplica struct {
	cli  *clientv3.Client
	sess *concurrency.Session
}

func newMutexReplica(b *testing.B, c *testetcd.Cluster, ttl time.Duration) (replica, *calls) {
	cli, n := countingClient(b, c)
	secs, _ := ttlSecondsOf(ttl)
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(secs)))
	if err != nil {
		b.Fatal(err)
	}
	return &mutexReplica{cli: cli, sess: sess}, n
}

func (r *mutexReplica) lock(ctx context.Context, key string, _ time.Duration) (func(context.Context) error, error) {
	m := concurrency.NewMutex(r.sess, "/mutex/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return m.Unlock, nil
}

func (r *mutexReplica) lockKey(key string) string { return "/mutex/" + key + "/" }
func (r *mutexReplica) crash()                    { r.sess.Orphan(); _ = r.cli.Close() }
func (r *mutexReplica) close()                    { _ = r.sess.Close() }

// storeReplica waits with the store alone: Acquire (which queues), then
// WaitRelease, which watches from the revision of that answer, so nothing
// is missed without another Acquire; Acquire again when woken (or every
// half queue TTL, to keep the place in the queue).
type storeReplica struct {
	cli *clientv3.Client
	s   *etcdstore.Store
}

const benchQueueTTL = 10 * time.Second

func newStoreReplica(b *testing.B, c *testetcd.Cluster, _ time.Duration) (replica, *calls) {
	cli, n := countingClient(b, c)
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: benchPrefix})
	if err != nil {
		b.Fatal(err)
	}
	return &storeReplica{cli: cli, s: s}, n
}

func (r *storeReplica) lock(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
	tok := leasehold.NewToken()
	req := driver.AcquireRequest{Key: key, Token: tok, TTL: ttl, Holder: "bench", QueueTTL: benchQueueTTL}
	var wake <-chan driver.Wake
	stop := func() {}
	defer func() { stop() }()
	for {
		_, err := r.s.Acquire(ctx, req)
		if err == nil {
			return func(ctx context.Context) error { return r.s.Release(ctx, key, tok) }, nil
		}
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			return nil, err
		}
		if wake == nil {
			w, st, err := r.s.WaitRelease(ctx, key, tok)
			if err != nil {
				return nil, err
			}
			wake, stop = w, st
		}
		select {
		case <-wake:
		case <-time.After(benchQueueTTL / 2):
		case <-ctx.Done():
			_ = r.s.Release(context.WithoutCancel(ctx), key, tok) // leave the queue
			return nil, ctx.Err()
		}
	}
}

func (r *storeReplica) lockKey(key string) string { return benchPrefix + key }
func (r *storeReplica) crash()                    { _ = r.cli.Close() } // keep-alives stop
func (r *storeReplica) close()                    { _ = r.s.Close() }

// lockerReplica is a Locker over the store: Acquire waits as the Locker
// does.
type lockerReplica struct {
	storeReplica
	lk *leasehold.Locker
}

func newLockerReplica(b *testing.B, c *testetcd.Cluster, ttl time.Duration) (replica, *calls) {
	sr, n := newStoreReplica(b, c, ttl)
	lk, err := leasehold.New(sr.(*storeReplica).s, leasehold.Options{
		Name: "bench", TTL: ttl, WaitCap: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	return &lockerReplica{storeReplica: *sr.(*storeReplica), lk: lk}, n
}

func (r *lockerReplica) lock(ctx context.Context, key string, _ time.Duration) (func(context.Context) error, error) {
	l, err := r.lk.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (r *lockerReplica) crash() { _ = r.cli.Close() }
func (r *lockerReplica) close() { _ = r.lk.Close(); r.storeReplica.close() }

func ttlSecondsOf(ttl time.Duration) (int64, error) {
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// raftEntries reads the member's committed raft entries (a WAL write each;
// etcd batches their fsyncs only across concurrent requests).
func raftEntries(b *testing.B, c *testetcd.Cluster) float64 {
	return c.Metric(b, 0, "etcd_server_proposals_committed_total")
}

// benchFor is how long each implementation runs in the uncontended and
// contended benchmarks (LEASEHOLD_BENCH_FOR, default 3s).
func benchFor() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("LEASEHOLD_BENCH_FOR")); err == nil && d > 0 {
		return d
	}
	return 3 * time.Second
}

// BenchmarkUncontended is acquire + release of distinct keys by 1 and 16
// goroutines of one replica per implementation. The implementations take
// turns in 250 ms slices (the machine's load changes from second to
// second), for benchFor each: cycles/s, requests, raft entries and process
// CPU (client and embedded server) per cycle,
// and the ratio to the mutex's rate in the same round (median, min, max).
// Use -benchtime 1x. LEASEHOLD_BENCH_ONLY=mutex, store or locker runs that
// one alone (for -cpuprofile).
func BenchmarkUncontended(b *testing.B) {
	c := testetcd.Start(b)
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			for b.Loop() {
				uncontended(b, c, g)
			}
		})
	}
}

// side is one implementation's share of an uncontended run.
type side struct {
	im     impl
	r      replica
	n      *calls
	cycles int
	el     time.Duration
	reqs   int
	raft   float64
	cpu    time.Duration // process CPU (client and embedded server)
	rates  []float64
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func uncontended(b *testing.B, c *testetcd.Cluster, g int) {
	ctx := b.Context()
	var sides []*side
	for _, im := range impls {
		if o := os.Getenv("LEASEHOLD_BENCH_ONLY"); o != "" && o != im.name { // one alone, to profile it
			continue
		}
		r, n := im.new(b, c, 10*time.Second)
		defer r.close()
		cycles(b, ctx, r, g, 50*time.Millisecond) // warm up: sessions, leases, connections
		sides = append(sides, &side{im: im, r: r, n: n})
	}
	const slice = 250 * time.Millisecond
	for round := 0; sides[0].el < benchFor(); round++ {
		for k := range sides {
			sd := sides[(round+k)%len(sides)] // each goes first in turn
			sd.n.take()
			raft0 := raftEntries(b, c)
			cpu0 := cpuTime(b)
			start := time.Now()
			n := cycles(b, ctx, sd.r, g, slice)
			el := time.Since(start)
			sd.cpu += cpuTime(b) - cpu0
			sd.cycles += n
			sd.el += el
			sd.reqs += total(sd.n.take())
			sd.raft += raftEntries(b, c) - raft0
			sd.rates = append(sd.rates, float64(n)/el.Seconds())
		}
	}
	for _, sd := range sides {
		b.ReportMetric(float64(sd.cycles)/sd.el.Seconds(), sd.im.name+"-cycles/s")
		b.ReportMetric(float64(sd.reqs)/float64(sd.cycles), sd.im.name+"-req/cycle")
		b.ReportMetric(sd.raft/float64(sd.cycles), sd.im.name+"-raft/cycle")
		b.ReportMetric(float64(sd.cpu.Microseconds())/float64(sd.cycles), sd.im.name+"-cpuµs/cycle")
		if sd != sides[0] {
			var ratios []float64
			for i, rate := range sd.rates {
				ratios = append(ratios, rate/sides[0].rates[i])
			}
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], sd.im.name+"/mutex-median")
			b.ReportMetric(ratios[0], sd.im.name+"/mutex-min")
			b.ReportMetric(ratios[len(ratios)-1], sd.im.name+"/mutex-max")
		}
	}
}

// cycles runs lock + unlock of distinct keys on g goroutines of r for d and
// returns how many cycles completed.
func cycles(b *testing.B, ctx context.Context, r replica, g int, d time.Duration) int {
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for i := range g {
		wg.Go(func() {
			key := fmt.Sprintf("u%d", i)
			for time.Now().Before(deadline) {
				unlock, err := r.lock(ctx, key, 10*time.Second)
				if err != nil {
					b.Error(err)
					return
				}
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}

// BenchmarkContended runs 8 replicas (8 clients) on one key, each holding
// it 1 ms per acquisition, for contendFor per implementation: wait p99,
// requests per acquisition (all replicas' requests, releases included),
// and the fewest and most acquisitions of one replica. Use -benchtime 1x.
func BenchmarkContended(b *testing.B) {
	c := testetcd.Start(b)
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for b.Loop() {
				contended(b, c, im)
			}
		})
	}
}

func contended(b *testing.B, c *testetcd.Cluster, im impl) {
	const replicas = 8
	key := fmt.Sprintf("contended-%d", time.Now().UnixNano())
	rs := make([]replica, replicas)
	ns := make([]*calls, replicas)
	for i := range rs {
		rs[i], ns[i] = im.new(b, c, 10*time.Second)
		defer rs[i].close()
	}
	for _, n := range ns {
		n.take()
	}
	ctx, cancel := context.WithTimeout(b.Context(), benchFor())
	defer cancel()
	var mu sync.Mutex
	var waits []time.Duration
	counts := make([]int, replicas)
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				unlock, err := r.lock(ctx, key, 10*time.Second)
				if err != nil {
					return // the run ended while waiting
				}
				w := time.Since(start)
				time.Sleep(time.Millisecond)
				if err := unlock(context.WithoutCancel(ctx)); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				waits = append(waits, w)
				counts[i]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	reqs, kas := 0, 0
	for _, n := range ns {
		got := n.take()
		reqs += total(got)
		kas += got["/etcdserverpb.Lease/LeaseKeepAlive"]
	}
	slices.Sort(waits)
	if len(waits) == 0 {
		b.Fatal("no acquisition")
	}
	b.ReportMetric(float64(len(waits))/benchFor().Seconds(), "acq/s")
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "wait-p50-ms")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "wait-p99-ms")
	b.ReportMetric(float64(waits[len(waits)-1].Microseconds())/1000, "wait-max-ms")
	b.ReportMetric(float64(reqs)/float64(len(waits)), "req/acq")
	b.ReportMetric(float64(kas)/float64(len(waits)), "keepalive/acq")
	b.ReportMetric(float64(slices.Min(counts)), "min-acq")
	b.ReportMetric(float64(slices.Max(counts)), "max-acq")
	b.ReportMetric(float64(slices.Min(counts))/float64(slices.Max(counts)), "min/max")
}

// BenchmarkTakeover crashes a holder (no release, its lease not kept alive
// any more) while another replica waits, and measures how long after etcd
// deleted the lock (seen by an observer's watch) the waiter holds it: p50 and
// max over 5 rounds per implementation, TTL 1 s. Use -benchtime 1x.
func BenchmarkTakeover(b *testing.B) {
	c := testetcd.Start(b)
	obs := c.Client(b)
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for b.Loop() {
				var lags, ttlLags []time.Duration
				for round := range 5 {
					lag, ttlLag := takeover(b, c, obs, im, fmt.Sprintf("takeover-%d-%d", time.Now().UnixNano(), round))
					lags, ttlLags = append(lags, lag), append(ttlLags, ttlLag)
				}
				slices.Sort(lags)
				slices.Sort(ttlLags)
				b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "lag-p50-ms")
				b.ReportMetric(float64(lags[len(lags)-1].Microseconds())/1000, "lag-max-ms")
				b.ReportMetric(float64(ttlLags[len(ttlLags)/2].Microseconds())/1000, "ttl-lag-p50-ms")
				b.ReportMetric(float64(ttlLags[len(ttlLags)-1].Microseconds())/1000, "ttl-lag-max-ms")
			}
		})
	}
}

// It returns the lag after the observer saw the lock deleted (0 when the
// waiter overwrote it), and the lag after the holder's TTL counted from
// before its acquire was sent (the store's takeover; etcd's Mutex adds the
// 100 ms its session stays alive before the crash, and its lease expiry).
func takeover(b *testing.B, c *testetcd.Cluster, obs *clientv3.Client, im impl, key string) (time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	holder, _ := im.new(b, c, ttl)
	waiter, _ := im.new(b, c, ttl)
	defer waiter.close()
	locked := time.Now()
	if _, err := holder.lock(ctx, key, ttl); err != nil {
		b.Fatal(err)
	}
	freed := make(chan time.Time, 1)
	wch := obs.Watch(ctx, holder.lockKey(key), clientv3.WithPrefix(), clientv3.WithFilterPut())
	got := make(chan time.Time, 1)
	go func() {
		unlock, err := waiter.lock(ctx, key, ttl)
		if err != nil {
			b.Error(err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		_ = unlock(ctx)
	}()
	time.Sleep(100 * time.Millisecond) // the waiter queues and waits
	holder.crash()
	defer holder.close()
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if !strings.ContainsRune(string(ev.Kv.Key), 0) { // not a queue entry
					freed <- time.Now()
					return
				}
			}
		}
	}()
	at := <-got
	var free time.Time
	select {
	case free = <-freed:
	case <-time.After(time.Second): // the waiter overwrote the lock, then released it
	}
	cancel()
	for range wch {
	}
	if at.IsZero() {
		b.FailNow()
	}
	lag := time.Duration(0)
	if !free.IsZero() {
		lag = max(at.Sub(free), 0)
	}
	return lag, at.Sub(locked.Add(ttl))
}

// BenchmarkHandOff measures how long a waiter blocked in Acquire (another
// Locker, another client: another replica) takes to get the key after the
// holder's Release starts. Reports p50 and p99 in microseconds.
func BenchmarkHandOff(b *testing.B) {
	c := testetcd.Start(b)
	holder, waiter := benchLocker(b, c), benchLocker(b, c)
	ctx := b.Context()
	key := "bench:handoff"
	var lat []time.Duration
	for b.Loop() {
		l, err := holder.TryAcquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			wl, err := waiter.Acquire(ctx, key)
			if err != nil {
				errc <- err
				return
			}
			got <- time.Now()
			_ = wl.Release(context.WithoutCancel(ctx))
		}()
		b.StopTimer()
		time.Sleep(30 * time.Millisecond) // let the waiter try, subscribe and block
		b.StartTimer()
		start := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		select {
		case at := <-got:
			lat = append(lat, at.Sub(start))
		case err := <-errc:
			b.Fatal(err)
		}
		b.StopTimer()
		for {
			if _, err := holder.Store().(driver.Inspector).Inspect(ctx, key); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds()), "p99-µs")
}

func benchLocker(b *testing.B, c *testetcd.Cluster) *leasehold.Locker {
	b.Helper()
	s, err := newStoreTB(b, c)
	if err != nil {
		b.Fatal(err)
	}
	lk, err := leasehold.New(s, leasehold.Options{
		Name: "bench", TTL: 10 * time.Second, WaitCap: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	return lk
}

// BenchmarkIdleWaiters is etcd's write load from waiting: one Locker holds
// a key (renewing it) while 16 others, each with its own Store and client,
// wait for it with the default WaiterTTL (a refresh a second), for 3 s.
// Reported: raft entries per second, and per waiter. Use -benchtime 1x.
func BenchmarkIdleWaiters(b *testing.B) {
	c := testetcd.Start(b)
	for b.Loop() {
		idleWaiters(b, c, 16, 3*time.Second)
	}
}

func idleWaiters(b *testing.B, c *testetcd.Cluster, n int, d time.Duration) {
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	key := fmt.Sprintf("idle-%d", time.Now().UnixNano())
	opts := leasehold.Options{Name: "idle", TTL: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	locker := func() *leasehold.Locker {
		sr, _ := newStoreReplica(b, c, 0)
		s := sr.(*storeReplica).s
		lk, err := leasehold.New(s, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lk.Close(); _ = s.Close() })
		return lk
	}
	held, err := locker().Acquire(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for range n {
		lk := locker()
		wg.Go(func() {
			if l, err := lk.Acquire(ctx, key); err == nil { // after the holder
				_ = l.Release(context.WithoutCancel(ctx))
			}
		})
	}
	time.Sleep(d / 3) // all queued
	raft0, start := raftEntries(b, c), time.Now()
	time.Sleep(d)
	rate := (raftEntries(b, c) - raft0) / time.Since(start).Seconds()
	cancel()
	wg.Wait()
	_ = held.Release(context.Background())
	b.ReportMetric(rate, "raft/s")
	b.ReportMetric(rate/float64(n), "raft/s/waiter")
}
