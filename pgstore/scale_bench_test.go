package pgstore_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

var (
	scaleLeases = flag.String("scale.leases", "1000,10000", "BenchmarkScale: comma-separated numbers of held leases")
	scaleTTL    = flag.Duration("scale.ttl", 2*time.Second, "BenchmarkScale: lease TTL")
	scaleHold   = flag.Duration("scale.hold", 10*time.Second, "BenchmarkScale: how long the leases are held")
	scaleWait   = flag.Int("scale.waiters", 0, "BenchmarkScale: idle waiters (Acquire on held keys, one more Locker)")
	scaleLocks  = flag.Int("scale.lockers", 1, "BenchmarkScale: Lockers sharing the held leases")
)

// BenchmarkScale holds N leases from P Lockers on a real PostgreSQL (TTL
// 2 s) while K goroutines of one more Locker wait for some of the keys, and
// reports heap per lease and per waiter, transactions (as requests/s; from
// pg_stat_database) and renewals per second, client and PostgreSQL CPU (the postmaster and its backends, from
// /proc/PID/stat) and the leases that ended before Close. Each Locker has
// its own Store (pool). One run per N whatever -benchtime says:
//
//	go test -run '^$' -bench Scale ./pgstore/ -args -scale.leases 10000 -scale.waiters 1000
func BenchmarkScale(b *testing.B) {
	srv := testpg.Start(b)
	dsn := srv.CreateDatabase(b)
	pool := testpg.Connect(b, dsn, pgxpool.New)
	var backend int
	if err := pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	postmaster := benchkit.ParentOf(b, backend)
	xacts := func() int64 {
		var n int64
		err := pool.QueryRow(context.Background(), "SELECT pg_stat_force_next_flush(), xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(nil, &n)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	for _, f := range strings.Split(*scaleLeases, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("bad -scale.leases %q", *scaleLeases)
		}
		b.Run(fmt.Sprintf("N=%d/K=%d/P=%d", n, *scaleWait, *scaleLocks), func(b *testing.B) {
			cfg := benchkit.ScaleConfig{Leases: n, Waiters: min(*scaleWait, n), Lockers: *scaleLocks,
				Hold: *scaleHold, ServerPID: postmaster, Requests: xacts}
			r := benchkit.Scale(b, cfg, func(obs leasehold.Observer) (*leasehold.Locker, error) {
				st := open(b, dsn, pgstore.Options{})
				return leasehold.New(st, leasehold.Options{Name: "scale", TTL: *scaleTTL, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
			})
			r.Report(b)
		})
	}
}
