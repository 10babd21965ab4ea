package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
	"github.com/leasehold/leasehold/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newStore returns a Store over c, closed in t.Cleanup.
func newStore(t *testing.T, c redisstore.Client, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) leasehold.Store { return newStore(t, c, redisstore.Options{}) },
		Break: func(t *testing.T, _ leasehold.Store) { srv.Stop() },
		Heal:  func(t *testing.T, _ leasehold.Store) { srv.Restart() },
	})
}

func TestConformanceCustomPrefix(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) leasehold.Store {
			return newStore(t, redis.UniversalClient(c), redisstore.Options{Prefix: "app[1]*{x}:"})
		},
	})
}
