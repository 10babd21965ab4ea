package redisstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/driver"
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
		New:       func(t *testing.T) driver.Store { return newStore(t, newClient(t, srv.Addr), redisstore.Options{}) },
		Break:     func(t *testing.T, _ driver.Store) { srv.Stop() },
		Heal:      func(t *testing.T, _ driver.Store) { srv.Restart() },
		Freeze:    func(t *testing.T, _ driver.Store) func() { return srv.Freeze() },
		Leftovers: func(t *testing.T) []string { return leftovers(t, newClient(t, srv.Addr)) },
	})
}

// leftovers lists the Redis keys (fence counters and release records
// excepted: they are the documented state that stays, the records for 10 s)
// and the subscribed channels, plain and
// sharded, whose names contain t's name as storetest writes it into keys:
// what the stores of t's subtests left behind.
func leftovers(t *testing.T, c redis.UniversalClient) []string {
	t.Helper()
	ctx := t.Context()
	mark := strings.ReplaceAll(t.Name(), "/", ".")
	var out []string
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		if k := iter.Val(); strings.Contains(k, mark) && !strings.HasSuffix(k, ":fence") && !strings.Contains(k, ":released:") {
			out = append(out, "key "+k)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"CHANNELS", "SHARDCHANNELS"} {
		chans, err := c.Do(ctx, "PUBSUB", kind).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range chans {
			if strings.Contains(ch, mark) {
				out = append(out, "channel "+ch)
			}
		}
	}
	return out
}

func TestConformanceCustomPrefix(t *testing.T) {
	srv := testredis.Start(t)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store {
			return newStore(t, redis.UniversalClient(newClient(t, srv.Addr)), redisstore.Options{Prefix: "app[1]*{x}:"})
		},
		Slack: time.Second,
	})
}

// TestLiveness runs storetest's randomized liveness test: each replica is a
// Store over a client of its own, as a separate process has.
func TestLiveness(t *testing.T) {
	srv := testredis.Start(t)
	storetest.RunLiveness(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return newStore(t, newClient(t, srv.Addr), redisstore.Options{}) },
	}, 0)
}
