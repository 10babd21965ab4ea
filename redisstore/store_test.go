package redisstore_test

import (
	"testing"
	"time"

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

// newClient returns a client of its own for addr, as a separate process
// has, with context deadlines on (as the package doc asks), closed in
// t.Cleanup.
func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestConformance(t *testing.T) {
	srv := testredis.Start(t)
	storetest.Run(t, storetest.Harness{
		New:    func(t *testing.T) leasehold.Store { return newStore(t, newClient(t, srv.Addr), redisstore.Options{}) },
		Break:  func(t *testing.T, _ leasehold.Store) { srv.Stop() },
		Heal:   func(t *testing.T, _ leasehold.Store) { srv.Restart() },
		Freeze: func(t *testing.T, _ leasehold.Store) func() { return srv.Freeze() },
	})
}

func TestConformanceCustomPrefix(t *testing.T) {
	srv := testredis.Start(t)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) leasehold.Store {
			return newStore(t, redis.UniversalClient(newClient(t, srv.Addr)), redisstore.Options{Prefix: "app[1]*{x}:"})
		},
		Slack: time.Second,
	})
}
