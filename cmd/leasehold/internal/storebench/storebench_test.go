package storebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/redisstore"
)

// TestMain checks for leaked goroutines, giving the embedded etcd member's
// connections time to close (see testetcd.LeakWait).
func TestMain(m *testing.M) { testetcd.VerifyTestMain(m) }

const (
	ttl     = 30 * time.Second // long enough that no lease expires during a run
	waiters = 4                // Lockers contending for one key in handoff
)

// servers are the real servers every store but memory talks to, started once.
type servers struct {
	redis *testredis.Server
	etcd  *testetcd.Cluster
}

func startServers(tb testing.TB) *servers {
	tb.Helper()
	return &servers{redis: testredis.Start(tb), etcd: testetcd.Start(tb)}
}

// backends in the order they are reported.
var backends = []string{"memory", "redis", "etcd"}

// stores returns n stores of one backend that share their locks, each closed
// in tb.Cleanup. Redis and etcd stores each get their own client, as n
// processes would; the memory store exists only in this process, so its n
// stores are one store.
func (s *servers) stores(tb testing.TB, backend string, n int) []driver.Store {
	tb.Helper()
	out := make([]driver.Store, n)
	switch backend {
	case "memory":
		ms := memstore.New()
		for i := range out {
			out[i] = ms
		}
	case "redis":
		for i := range out {
			st, err := redisstore.New(s.redis.Client(tb), redisstore.Options{Prefix: "storebench:"})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = st.Close() }) // runs before the client's Close
			out[i] = st
		}
	case "etcd":
		for i := range out {
			st, err := etcdstore.Open(context.Background(), s.etcd.Endpoints(), etcdstore.Options{Prefix: "storebench/"})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = st.Close() }) // closes its client too
			out[i] = st
		}
	default:
		tb.Fatalf("unknown backend %q", backend)
	}
	return out
}

// lockers returns one Locker per store, closed in tb.Cleanup. WaitCap is
// long so that a waiter that misses a release notification shows up in the
// hand-off's p99 instead of being hidden by polling.
func lockers(tb testing.TB, stores []driver.Store) []*leasehold.Locker {
	tb.Helper()
	out := make([]*leasehold.Locker, len(stores))
	for i, st := range stores {
		lk, err := leasehold.New(st, leasehold.Options{
			Name: "storebench", TTL: ttl, WaitCap: 10 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = lk.Close() })
		out[i] = lk
	}
	return out
}

// lockerCycle is one Locker.TryAcquire + Lease.Release.
func lockerCycle(ctx context.Context, lk *leasehold.Locker, key string) error {
	l, err := lk.TryAcquire(ctx, key)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

// redisFloor is the raw Redis minimum of a lock cycle: SET NX PX, then a
// token-checked compare-and-delete script (EVALSHA, EVAL on a cache miss).
type redisFloor struct{ c *redis.Client }

var compareAndDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func (f redisFloor) cycle(ctx context.Context, key, token string) error {
	ok, err := f.c.SetNX(ctx, key, token, ttl).Result()
	if err != nil || !ok {
		return fmt.Errorf("SET NX %s: ok=%v err=%v", key, ok, err)
	}
	n, err := compareAndDelete.Run(ctx, f.c, []string{key}, token).Int()
	if err != nil || n != 1 {
		return fmt.Errorf("compare-and-delete %s: deleted=%d err=%v", key, n, err)
	}
	return nil
}

// etcdFloor is the raw etcd minimum of a lock cycle with expiry: LeaseGrant,
// a Txn that puts the key with that lease only if it does not exist, then
// LeaseRevoke, which deletes the key with the lease (the lease ID is the
// owner check). Three round trips, three raft writes.
type etcdFloor struct{ c *clientv3.Client }

func (f etcdFloor) cycle(ctx context.Context, key, token string) error {
	g, err := f.c.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	resp, err := f.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, token, clientv3.WithLease(g.ID))).
		Commit()
	if err != nil || !resp.Succeeded {
		return fmt.Errorf("txn put %s: succeeded=%v err=%v", key, resp != nil && resp.Succeeded, err)
	}
	if _, err := f.c.Revoke(ctx, g.ID); err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	return nil
}

// BenchmarkStores runs the same Locker operations on memory, Redis and etcd
// in one run, against one redis-server and one embedded etcd member started
// once:
//
//   - <store>/cycle/g=G: Locker.TryAcquire + Lease.Release, G goroutines each
//     on its own key, one Locker over one store.
//   - redis/raw-floor/g=G, etcd/raw-floor/g=G: the same cycle done by hand
//     with the store's client (see redisFloor, etcdFloor).
//   - <store>/handoff: 4 Lockers, each over its own store and client (as 4
//     processes), contend for one key; p50-µs, p99-µs and max-µs are the
//     latencies from just before Release to the next waiter's Acquire
//     returning.
//
// Allocations of the etcd benchmarks include the embedded server's work,
// which runs in this process.
func BenchmarkStores(b *testing.B) {
	srv := startServers(b)
	rc := srv.redis.Client(b)
	if err := compareAndDelete.Load(context.Background(), rc).Err(); err != nil {
		b.Fatal(err)
	}
	floors := map[string]func(ctx context.Context, key, token string) error{
		"redis": redisFloor{rc}.cycle,
		"etcd":  etcdFloor{srv.etcd.Client(b)}.cycle,
	}
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			for _, g := range []int{1, 8} {
				if floor := floors[name]; floor != nil {
					b.Run(fmt.Sprintf("raw-floor/g=%d", g), func(b *testing.B) {
						benchkit.Parallel(b, g, floor)
					})
				}
				b.Run(fmt.Sprintf("cycle/g=%d", g), func(b *testing.B) {
					lk := lockers(b, srv.stores(b, name, 1))[0]
					benchkit.Parallel(b, g, func(ctx context.Context, key, _ string) error {
						return lockerCycle(ctx, lk, key)
					})
				})
			}
			b.Run("handoff", func(b *testing.B) {
				lks := lockers(b, srv.stores(b, name, waiters))
				b.ReportAllocs()
				b.ResetTimer()
				samples, _, err := benchkit.HandOff(context.Background(), lks, "bench:handoff", b.N)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if len(samples) != b.N {
					b.Fatalf("%d hand-offs measured, want %d", len(samples), b.N)
				}
				slices.Sort(samples)
				b.ReportMetric(benchkit.Quantile(samples, 0.50), "p50-µs")
				b.ReportMetric(benchkit.Quantile(samples, 0.99), "p99-µs")
				b.ReportMetric(benchkit.Quantile(samples, 1), "max-µs")
			})
		})
	}
}

// TestStoresHarness runs every code path of BenchmarkStores once, so that
// `go test ./...` checks the harness without running benchmarks: both servers
// start, the raw floors complete a cycle, and on every store two Lockers
// exclude each other, fences grow, and a key is handed off among waiters.
func TestStoresHarness(t *testing.T) {
	srv := startServers(t)
	ctx := t.Context()
	rc := srv.redis.Client(t)
	for name, floor := range map[string]func(ctx context.Context, key, token string) error{
		"redis": redisFloor{rc}.cycle,
		"etcd":  etcdFloor{srv.etcd.Client(t)}.cycle,
	} {
		for i := range 2 { // the second cycle proves the first released the key
			if err := floor(ctx, "test:floor", leasehold.NewToken()); err != nil {
				t.Fatalf("%s raw floor, cycle %d: %v", name, i, err)
			}
		}
	}
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			lks := lockers(t, srv.stores(t, name, 3))
			a, err := lks[0].TryAcquire(ctx, "test:cycle")
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			if _, err := lks[1].TryAcquire(ctx, "test:cycle"); !errors.Is(err, leasehold.ErrNotAcquired) {
				t.Fatalf("second Locker's TryAcquire while held: %v, want ErrNotAcquired", err)
			}
			if err := a.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if err := lockerCycle(ctx, lks[1], "test:cycle"); err != nil {
				t.Fatalf("cycle after release: %v", err)
			}

			const n = 5
			samples, fences, err := benchkit.HandOff(ctx, lks, "test:handoff", n)
			if err != nil {
				t.Fatalf("handoff: %v", err)
			}
			if len(samples) != n || len(fences) != n+1 {
				t.Fatalf("handoff: %d samples, %d fences; want %d, %d", len(samples), len(fences), n, n+1)
			}
			for i := 1; i < len(fences); i++ {
				if fences[i] <= fences[i-1] {
					t.Fatalf("fences not increasing across hand-offs: %v", fences)
				}
			}
		})
	}
}
