package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// BenchmarkPermitCycle measures uncontended store cycles side by side in one
// run: the lock (acquire script + release script) and a permit of a
// semaphore with limit N (acquire_permit + release_permit scripts), each two
// round trips. Every goroutine uses its own key.
func BenchmarkPermitCycle(b *testing.B) {
	srv := testredis.Start(b)
	s, err := redisstore.New(srv.Client(b), redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	const ttl = 30 * time.Second
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("lock/g=%d", g), func(b *testing.B) {
			benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: token, TTL: ttl}); err != nil {
					return err
				}
				return s.Release(ctx, key, token)
			})
		})
		for _, n := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("permit/N=%d/g=%d", n, g), func(b *testing.B) {
				benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
					req := driver.PermitRequest{Key: key, Token: token, TTL: ttl, Limit: n}
					if _, err := s.AcquirePermit(ctx, req); err != nil {
						return err
					}
					return s.ReleasePermit(ctx, key, token)
				})
			})
		}
	}
}

// BenchmarkPermitVsLock interleaves lock cycles and permit cycles (limit N)
// in chunks on one connection, so both see the same machine load, and
// reports each one's client time, Redis server CPU (INFO cpu) and commands
// sent per cycle, and the permit/lock ratios. One b.N is one lock cycle plus
// one permit cycle.
func BenchmarkPermitVsLock(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	var cmds atomic.Int64
	c.AddHook(countHook{&cmds})
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	admin := srv.Client(b)
	ctx := context.Background()
	const ttl = 30 * time.Second
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			lockKey, semKey := "bench:lock:"+b.Name(), "bench:sem:"+b.Name()
			var lockT, permT, lockCPU, permCPU time.Duration
			var lockCmds, permCmds int64
			lock := func(tok string) {
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: lockKey, Token: tok, TTL: ttl}); err != nil {
					b.Fatal(err)
				}
				if err := s.Release(ctx, lockKey, tok); err != nil {
					b.Fatal(err)
				}
			}
			permit := func(tok string) {
				if _, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: semKey, Token: tok, TTL: ttl, Limit: n}); err != nil {
					b.Fatal(err)
				}
				if err := s.ReleasePermit(ctx, semKey, tok); err != nil {
					b.Fatal(err)
				}
			}
			phase := func(k int, f func(string), wall, cpu *time.Duration, sent *int64) {
				c0, n0, t0 := permitServerCPU(b, admin), cmds.Load(), time.Now()
				for range k {
					f(leasehold.NewToken())
				}
				*wall += time.Since(t0)
				*sent += cmds.Load() - n0
				*cpu += permitServerCPU(b, admin) - c0
			}
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(200, b.N-done)
				phase(k, lock, &lockT, &lockCPU, &lockCmds)
				phase(k, permit, &permT, &permCPU, &permCmds)
				done += k
			}
			b.StopTimer()
			N := float64(b.N)
			b.ReportMetric(float64(lockT.Nanoseconds())/N, "lock-ns/cycle")
			b.ReportMetric(float64(permT.Nanoseconds())/N, "permit-ns/cycle")
			b.ReportMetric(float64(permT)/float64(lockT), "permit/lock-time")
			b.ReportMetric(float64(lockCPU.Microseconds())/N, "lock-server-µs/cycle")
			b.ReportMetric(float64(permCPU.Microseconds())/N, "permit-server-µs/cycle")
			b.ReportMetric(float64(lockCmds)/N, "lock-cmds/cycle")
			b.ReportMetric(float64(permCmds)/N, "permit-cmds/cycle")
		})
	}
}

// countHook counts the commands a client sends (a pipeline counts each).
// countHook counts the commands a client sends, leaving out the handshake
// of a new connection (HELLO, CLIENT SETINFO, ...): the pool opens one when
// two commands overlap, which a busy machine makes happen at random.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(counted(cmd)); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.n.Add(counted(c))
		}
		return next(ctx, cmds)
	}
}

// counted is 0 for a connection's handshake commands and for INFO (the
// Locker's one-time settings check), 1 for the others.
func counted(cmd redis.Cmder) int64 {
	switch cmd.Name() {
	case "hello", "client", "auth", "select", "info":
		return 0
	}
	return 1
}

// permitServerCPU returns Redis's used_cpu_user + used_cpu_sys.
func permitServerCPU(b *testing.B, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkLockerPermitContended runs 16 separate Lockers (as 16 processes,
// each with its own client) that each loop: wait for the key (a lease, or a
// permit of a semaphore with limit N), hold it 1 ms, release. One b.N is one
// acquisition; it reports the wait p50/p99 and acquisitions per second.
func BenchmarkLockerPermitContended(b *testing.B) {
	srv := testredis.Start(b)
	const replicas = 16
	lks := make([]*leasehold.Locker, replicas)
	for i := range lks {
		s, err := redisstore.New(srv.Client(b), redisstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lk.Close() })
		lks[i] = lk
	}
	run := func(b *testing.B, acquire func(i int) (*leasehold.Lease, error)) {
		var (
			next  atomic.Int64
			mu    sync.Mutex
			waits []time.Duration
			wg    sync.WaitGroup
		)
		b.ResetTimer()
		start := time.Now()
		for i := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					t0 := time.Now()
					ls, err := acquire(i)
					if err != nil {
						b.Error(err)
						return
					}
					w := time.Since(t0)
					time.Sleep(time.Millisecond)
					_ = ls.Release(context.Background())
					mu.Lock()
					waits = append(waits, w)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		b.StopTimer()
		slices.Sort(waits)
		if len(waits) > 0 {
			b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "wait-p50-µs")
			b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "wait-p99-µs")
		}
		b.ReportMetric(float64(len(waits))/el.Seconds(), "acq/s")
	}
	ctx := context.Background()
	b.Run("lease", func(b *testing.B) {
		key := "bench:contended:" + b.Name()
		run(b, func(i int) (*leasehold.Lease, error) { return lks[i].Acquire(ctx, key) })
	})
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("permit/N=%d", n), func(b *testing.B) {
			sems := make([]*leasehold.Semaphore, replicas)
			for i, lk := range lks {
				sem, err := lk.Semaphore("bench:contended:"+b.Name(), n)
				if err != nil {
					b.Fatal(err)
				}
				sems[i] = sem
			}
			run(b, func(i int) (*leasehold.Lease, error) { return sems[i].Acquire(ctx) })
		})
	}
}

// BenchmarkLockerPermitCycle interleaves, in chunks of 200, Locker lease
// cycles (TryAcquire + Release) and permit cycles of a semaphore with limit
// N on one Locker, and reports both times per cycle, their ratio and the
// commands each cycle sent. One b.N is one lease cycle plus one permit cycle.
func BenchmarkLockerPermitCycle(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	var cmds atomic.Int64
	c.AddHook(countHook{&cmds})
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	ctx := context.Background()
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			sem, err := lk.Semaphore("bench:sem:"+b.Name(), n)
			if err != nil {
				b.Fatal(err)
			}
			key := "bench:lock:" + b.Name()
			lease := func() (*leasehold.Lease, error) { return lk.TryAcquire(ctx, key) }
			var t [2]time.Duration
			var sent [2]int64
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(200, b.N-done)
				for j, acquire := range []func() (*leasehold.Lease, error){lease, func() (*leasehold.Lease, error) { return sem.TryAcquire(ctx) }} {
					n0, t0 := cmds.Load(), time.Now()
					for range k {
						ls, err := acquire()
						if err != nil {
							b.Fatal(err)
						}
						if err := ls.Release(ctx); err != nil {
							b.Fatal(err)
						}
					}
					t[j] += time.Since(t0)
					sent[j] += cmds.Load() - n0
				}
				done += k
			}
			b.StopTimer()
			N := float64(b.N)
			b.ReportMetric(float64(t[0].Nanoseconds())/N, "lease-ns/cycle")
			b.ReportMetric(float64(t[1].Nanoseconds())/N, "permit-ns/cycle")
			b.ReportMetric(float64(t[1])/float64(t[0]), "permit/lease-time")
			b.ReportMetric(float64(sent[0])/N, "lease-cmds/cycle")
			b.ReportMetric(float64(sent[1])/N, "permit-cmds/cycle")
		})
	}
}
