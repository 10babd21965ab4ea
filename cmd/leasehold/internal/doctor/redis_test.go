package doctor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// find returns the result of check, failing the test when there is none.
func find(t *testing.T, rs []Result, check string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("expected a %s result, got %+v", check, rs)
	return Result{}
}

func wantStatus(t *testing.T, rs []Result, check string, want Status) Result {
	t.Helper()
	r := find(t, rs, check)
	if r.Status != want {
		t.Fatalf("%s: expected %s, got %s (%+v)", check, want, r.Status, r)
	}
	return r
}

// holdAndFill takes the lock on key with a 60 s lease, then writes cache
// entries (1 KiB, one hour TTL, as a cache sharing the Redis would) until
// the lock key is gone or 8 MiB were written, and reports whether a second
// locker could then take the same key while the first still held it.
func holdAndFill(t *testing.T, c *redis.Client, key string) (secondAcquired bool) {
	t.Helper()
	ctx := t.Context()
	newLocker := func() *leasehold.Locker {
		st, err := redisstore.New(c, redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := leasehold.New(st, leasehold.Options{TTL: 60 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(); _ = st.Close() })
		return l
	}
	a, b := newLocker(), newLocker()
	first, err := a.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	lockKey := "leasehold:{" + key + "}:lock"
	val := strings.Repeat("x", 1024)
	for i := 0; i < 8*1024; i++ {
		err := c.Set(ctx, fmt.Sprintf("cache:%s:%d", key, i), val, time.Hour).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break // noeviction: the cache write is refused, the lock stays
		}
		if err != nil {
			t.Fatal(err)
		}
		if i%64 == 0 && c.Exists(ctx, lockKey).Val() == 0 {
			break
		}
	}
	second, err := b.TryAcquire(ctx, key)
	switch {
	case errors.Is(err, leasehold.ErrNotAcquired):
		return false
	case err != nil && strings.Contains(err.Error(), "OOM"):
		return false // noeviction: a full Redis refuses the acquire too
	case err != nil:
		t.Fatal(err)
	}
	defer second.Release(context.Background())
	select {
	case <-first.Done():
		t.Fatalf("expected the first lease to still run when the second was granted, got it ended: %v", first.Err())
	default:
	}
	return true
}

// The measured double holder of issue 32: with maxmemory and a volatile-*
// policy, cache writes evict the lock key and a second locker takes the
// lock while the first still holds it; doctor fails that server. With
// noeviction the cache write is refused instead, the lock stays, and
// doctor passes.
func TestRedisEviction(t *testing.T) {
	srv := testredis.Start(t, "--maxmemory", "3mb", "--maxmemory-policy", "volatile-ttl")
	c := srv.Client(t)

	r := wantStatus(t, checkRedis(t, c, Options{}), "redis_eviction", Fail)
	if !strings.Contains(r.Seen, "volatile-ttl") || !strings.Contains(r.Fix, "maxmemory-policy noeviction") {
		t.Fatalf("expected what was seen and the fix, got %+v", r)
	}
	if !holdAndFill(t, c, "evict-a") {
		t.Fatal("expected eviction to let a second holder in (the failure doctor reports), got the lock still held")
	}
	if n, _ := c.Info(t.Context(), "stats").Result(); !strings.Contains(n, "evicted_keys:") || strings.Contains(n, "evicted_keys:0\r") {
		t.Fatalf("expected evicted keys, got stats %q", n)
	}

	if err := c.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	// Room for the locks again (the flush may not bring the memory in use
	// back under 3 MB at once), and for 2 MB of cache writes.
	used := parseInfo(c.Info(t.Context(), "memory").Val())["used_memory"]
	n, err := strconv.Atoi(used)
	if err != nil {
		t.Fatalf("used_memory %q: %v", used, err)
	}
	if err := c.ConfigSet(t.Context(), "maxmemory", strconv.Itoa(n+2<<20)).Err(); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, checkRedis(t, c, Options{}), "redis_eviction", OK)
	if holdAndFill(t, c, "evict-b") {
		t.Fatal("expected noeviction to keep the lock, got a second holder")
	}
}

// checkRedis runs the Redis checks, failing the test when the server does
// not answer.
func checkRedis(t *testing.T, c redis.UniversalClient, o Options) []Result {
	t.Helper()
	rs, err := Redis(t.Context(), c, o)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// A server that does not answer, or refuses the password, is an error, not
// a check result.
func TestRedisUnreachableOrRefused(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "right-pass")
	wrong := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Password: "wrong-pass"})
	defer wrong.Close()
	if _, err := Redis(t.Context(), wrong, Options{}); !errors.Is(err, ErrRefused) {
		t.Fatalf("expected ErrRefused for a wrong password, got %v", err)
	}
	down := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: fmt.Sprintf("127.0.0.1:%d", testredis.FreePort(t)), MaxRetries: -1})
	defer down.Close()
	if _, err := Redis(t.Context(), down, Options{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("expected ErrUnavailable for a closed port, got %v", err)
	}
}
