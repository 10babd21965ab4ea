package redisfence_test

import (
	"testing"

	"github.com/leasehold/leasehold/fence/internal/resourcetest"
	"github.com/leasehold/leasehold/fence/redisfence"
	"github.com/leasehold/leasehold/internal/testredis"
)

func BenchmarkRedisWrite(b *testing.B) {
	r, err := redisfence.NewRedis(testredis.Start(b).Client(b), redisfence.RedisOptions{})
	if err != nil {
		b.Fatal(err)
	}
	resourcetest.BenchWrites(b, r)
}
