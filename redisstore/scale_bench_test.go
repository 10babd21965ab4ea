package redisstore_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// BenchmarkScale holds N leases from P Lockers (one go-redis client) on a
// real redis-server (TTL 2 s: a renewal every 667 ms each) while K
// goroutines of one more Locker (its own client) wait for some of the keys, and reports heap per lease and per waiter,
// store requests (commands) and renewals per second, client and
// redis-server CPU (cores, from /proc/PID/stat) and the leases that ended
// before Close. One run per N whatever -benchtime says:
//
//	go test -run '^$' -bench Scale ./redisstore/ -args -scale.leases 100000 -scale.waiters 1000 -scale.lockers 1
func BenchmarkScale(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	var cmds atomic.Int64
	c.AddHook(countHook{&cmds})
	pid := serverPID(b, c)
	for _, cfg := range benchkit.ScaleRuns(b) {
		b.Run(cfg.Name(), func(b *testing.B) {
			if err := c.FlushDB(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
			newLocker := func(c *redis.Client, obs leasehold.Observer) (*leasehold.Locker, error) {
				st, err := redisstore.New(c, redisstore.Options{})
				if err != nil {
					return nil, err
				}
				b.Cleanup(func() { _ = st.Close() })
				return leasehold.New(st, leasehold.Options{Name: "scale", TTL: *benchkit.ScaleTTL, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
			}
			cfg.ServerPID, cfg.Requests = pid, cmds.Load
			cfg.NewWaiterLocker = func() (*leasehold.Locker, error) {
				wc := srv.Client(b) // the waiters' own client, as another process's
				wc.AddHook(countHook{&cmds})
				return newLocker(wc, nil)
			}
			r := benchkit.Scale(b, cfg, func(obs leasehold.Observer) (*leasehold.Locker, error) { return newLocker(c, obs) })
			r.Report(b)
		})
	}
}

// serverPID is redis-server's process id (INFO server).
func serverPID(b *testing.B, c *redis.Client) int {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				b.Fatal(err)
			}
			return pid
		}
	}
	b.Fatal("INFO server has no process_id")
	return 0
}
