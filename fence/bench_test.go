package fence_test

import (
	"strconv"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/internal/testredis"
)

// benchWrites alternates accepted writes (rising fence) and stale ones.
func benchWrites(b *testing.B, r fence.Resource) {
	ctx := b.Context()
	value := []byte(`{"state":"done"}`)
	b.ReportAllocs()
	var f uint64 = 10
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			f++
		}
		fv := f - uint64(i%2) // odd iterations are stale
		_ = r.Write(ctx, "bench:"+strconv.Itoa(i%64), fv, value)
	}
}

func BenchmarkRegisterWrite(b *testing.B) {
	benchWrites(b, fence.NewRegister(fence.RegisterOptions{}))
}

func BenchmarkRedisWrite(b *testing.B) {
	r, err := fence.NewRedis(testredis.Start(b).Client(b), fence.RedisOptions{})
	if err != nil {
		b.Fatal(err)
	}
	benchWrites(b, r)
}

func BenchmarkPostgresWrite(b *testing.B) {
	pool := testpg.Start(b).Pool(b)
	if _, err := pool.Exec(b.Context(), `CREATE TABLE jobs (id text PRIMARY KEY, data jsonb, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		b.Fatal(err)
	}
	t, err := fence.NewTable(pool, fence.TableOptions{Table: "jobs"})
	if err != nil {
		b.Fatal(err)
	}
	benchWrites(b, t)
}
