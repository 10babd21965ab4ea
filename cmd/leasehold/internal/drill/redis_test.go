package drill

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/internal/testredis"
)

// On Redis, through the fault proxy, the safe configuration survives every
// fault, the restart included (the drill started this redis-server, so it
// restarts it), and the faults really bit.
func TestRedisSafeConfigurationPassesEveryFault(t *testing.T) {
	testredis.Binary(t) // fails with an install hint when redis-server is missing
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: StoreRedisServer, TTL: 400 * time.Millisecond, Faults: AllFaults, Outage: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold on Redis, failed: %+v", rep.Failed())
	}
	if !strings.HasPrefix(rep.Config.Store, "redis") {
		t.Errorf("expected a redis store in the report, got %q", rep.Config.Store)
	}
	for _, w := range rep.History.Windows {
		if w.Skipped {
			t.Errorf("expected every fault injected, %s was skipped: %s", w.Fault, w.Note)
		}
	}
	if len(rep.History.Windows) != len(AllFaults) || len(rep.History.Restarts) != 1 {
		t.Errorf("expected %d fault windows and one restart, got %d and %d", len(AllFaults), len(rep.History.Windows), len(rep.History.Restarts))
	}
	if rejectedWrites(rep) == 0 {
		t.Errorf("expected the paused holder's stale write rejected, got none")
	}
	if len(rep.Takeovers) == 0 {
		t.Errorf("expected takeovers measured after the pause and the crash, got none")
	}
	if rep.Events["store_error"] == 0 {
		t.Errorf("expected store errors from the outage, latency and lost replies, got none")
	}
}

// An unsafe configuration (fail-open, fencing off) under a pause and a
// proxy outage fails the checker on a Redis started by the test harness.
// That Redis is not the drill's, so a restart is skipped with an INFO
// verdict, and the run leaves no key behind.
func TestRedisUnsafeConfigurationFails(t *testing.T) {
	srv := testredis.Start(t)
	direct := srv.Client(t)
	t.Parallel()
	rep, err := Run(t.Context(), Config{
		Store: srv.URL() + "/3", TTL: 300 * time.Millisecond, Jobs: 24, OnStoreError: leasehold.FailOpen, NoFencing: true,
		Faults: []Fault{FaultPause, FaultOutage, FaultRestart}, Outage: 600 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if rep.Passed {
		t.Fatal("expected the unsafe configuration to fail an invariant on Redis, every invariant passed")
	}
	if v := verdict(t, rep, "no stale write accepted").Verdict; v != Fail {
		t.Errorf("expected a stale write accepted (FAIL), got %s", v)
	}
	if v := verdict(t, rep, "no duplicate execution").Verdict; v != Fail {
		t.Errorf("expected duplicate executions (FAIL), got %s", v)
	}
	if rep.Events["fail_open"] == 0 {
		t.Errorf("expected fail-open fallbacks during the proxy outage, got none")
	}
	sk := verdict(t, rep, "faults skipped")
	if sk.Verdict != Info || !strings.Contains(sk.Summary, "restart") || !strings.Contains(sk.Summary, "did not start") {
		t.Errorf("expected an INFO verdict saying the restart was skipped and why, got %s %q", sk.Verdict, sk.Summary)
	}
	if len(rep.History.Restarts) != 0 {
		t.Errorf("expected no restart recorded, got %v", rep.History.Restarts)
	}
	db3 := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, DB: 3})
	defer db3.Close()
	for _, c := range []*redis.Client{direct, db3} {
		if left, err := c.Keys(t.Context(), "leasehold-drill:*").Result(); err != nil || len(left) != 0 {
			t.Errorf("expected the drill to delete its keys, found %v (%v)", left, err)
		}
	}
}

// A Redis that cannot be reached is a setup error, not a report; bad URLs
// are configuration errors that do not show the password.
func TestRedisSetupErrors(t *testing.T) {
	port := testredis.FreePort(t) // nothing listens there
	_, err := Run(t.Context(), Config{Store: fmt.Sprintf("redis://:hunter2@127.0.0.1:%d", port), Faults: []Fault{FaultOutage}, Jobs: 3})
	if !errors.Is(err, ErrSetup) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("expected ErrSetup without the password, got %v", err)
	}
	for _, s := range []string{"redis://:hunter2@127.0.0.1:6379/x", "memcached://127.0.0.1:11211", "redis://:hunter2@[::1"} {
		_, err := Config{Store: s}.WithDefaults()
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: expected ErrInvalidConfig without the password, got %v", storeurl.Describe(s), err)
		}
	}
	_, err = Run(t.Context(), Config{Store: StoreRedisServer, RedisServer: "/nonexistent/redis-server", Jobs: 3})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("expected ErrInvalidConfig for a missing redis-server binary, got %v", err)
	}
}
