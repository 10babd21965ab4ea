package pgfence_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/fence/internal/resourcetest"
	"github.com/leasehold/leasehold/fence/pgfence"
	"github.com/leasehold/leasehold/internal/testpg"
)

func BenchmarkPostgresWrite(b *testing.B) {
	pool := testpg.Connect(b, testpg.Start(b).DSN(), pgxpool.New)
	if _, err := pool.Exec(b.Context(), `CREATE TABLE jobs (id text PRIMARY KEY, data jsonb, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		b.Fatal(err)
	}
	t, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: "jobs"})
	if err != nil {
		b.Fatal(err)
	}
	resourcetest.BenchWrites(b, t)
}
