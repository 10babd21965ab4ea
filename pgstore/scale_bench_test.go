package pgstore_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
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
	for _, cfg := range benchkit.ScaleRuns(b) {
		b.Run(cfg.Name(), func(b *testing.B) {
			cfg.ServerPID, cfg.Requests = postmaster, xacts
			r := benchkit.Scale(b, cfg, func(obs leasehold.Observer) (*leasehold.Locker, error) {
				st := open(b, dsn, pgstore.Options{})
				return leasehold.New(st, leasehold.Options{Name: "scale", TTL: *benchkit.ScaleTTL, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
			})
			r.Report(b)
		})
	}
}
