package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// BenchmarkServerCPU compares the Store's uncontended acquire+release cycle
// with the raw floor (SET NX PX + compare-and-delete EVALSHA) in Redis
// server CPU and in client throughput. Phases of each alternate within one
// run, so both see the same machine load; each phase starts with CONFIG
// RESETSTAT and ends with INFO. Metrics:
//   - cpu-ratio: the server's process CPU (INFO cpu, user+sys) per cycle,
//     Store / floor;
//   - call-ratio: the top-level commands' usec (INFO commandstats: evalsha
//     for the Store; set + evalsha for the floor) per cycle, Store / floor;
//   - tput-ratio: cycles per second of the Store / of the floor.
func BenchmarkServerCPU(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if err := floorRelease.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	const ttl = 30 * time.Second
	floor := func(ctx context.Context, key, token string) error {
		if ok, err := c.SetNX(ctx, key, token, ttl).Result(); err != nil || !ok {
			return fmt.Errorf("SET NX: %v %v", ok, err)
		}
		if n, err := floorRelease.Run(ctx, c, []string{key}, token).Int(); err != nil || n != 1 {
			return fmt.Errorf("release: %v %v", n, err)
		}
		return nil
	}
	store := func(ctx context.Context, key, token string) error {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: token, TTL: ttl, Holder: "bench-host/1234"}); err != nil {
			return err
		}
		return s.Release(ctx, key, token)
	}
	if err := store(ctx, "warm", "up"); err != nil { // loads the scripts
		b.Fatal(err)
	}
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			const phase = 2000
			var fl, st phaseStats
			for done := 0; done < b.N; done += phase {
				fl.add(b, c, runPhase(b, g, phase, "floor", floor), "cmdstat_set", "cmdstat_evalsha")
				st.add(b, c, runPhase(b, g, phase, "store", store), "cmdstat_evalsha")
			}
			b.ReportMetric(st.cpu/fl.cpu, "cpu-ratio")
			b.ReportMetric(st.calls/fl.calls, "call-ratio")
			b.ReportMetric(fl.wall.Seconds()/st.wall.Seconds(), "tput-ratio")
			b.ReportMetric(fl.cpu/float64(fl.n), "floor-cpu-us/cycle")
			b.ReportMetric(st.cpu/float64(st.n), "store-cpu-us/cycle")
		})
	}
}

type phaseStats struct {
	n          int
	cpu, calls float64 // µs
	wall       time.Duration
}

// add resets the server's statistics, runs one phase and adds what INFO says.
func (p *phaseStats) add(b *testing.B, c *redis.Client, run func() (int, time.Duration), cmds ...string) {
	ctx := context.Background()
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := serverCPU(b, c)
	n, wall := run()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	p.cpu += serverCPU(b, c) - cpu0
	p.n += n
	p.wall += wall
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range cmds {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd+":"); ok {
				p.calls += infoField(b, rest, "usec")
			}
		}
	}
}

// serverCPU returns the server's used_cpu_user + used_cpu_sys in µs.
func serverCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f * 1e6
		}
	}
	return total
}

func infoField(b *testing.B, fields, name string) float64 {
	for _, f := range strings.Split(fields, ",") {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return x
		}
	}
	b.Fatalf("INFO field %s missing in %q", name, fields)
	return 0
}

// runPhase returns a phase of n cycles over g goroutines on distinct keys.
func runPhase(b *testing.B, g, n int, name string, fn func(ctx context.Context, key, token string) error) func() (int, time.Duration) {
	return func() (int, time.Duration) {
		ctx := context.Background()
		var wg sync.WaitGroup
		errc := make(chan error, g)
		start := time.Now()
		for i := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key, token := fmt.Sprintf("cpu:%s:%d", name, i), leasehold.NewToken()
				for range n / g {
					if err := fn(ctx, key, token); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		wall := time.Since(start)
		close(errc)
		for err := range errc {
			b.Fatal(err)
		}
		return n / g * g, wall
	}
}
