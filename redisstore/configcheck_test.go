package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// syncBuf is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// checkedLocker takes one lock through a Locker over c, waits until the
// background settings check has done its I/O (the store read evicted_keys,
// or the Locker logged) and reported want warnings, closes the Locker
// (which waits for the check) and returns the warnings it observed and its
// log.
func checkedLocker(t *testing.T, c redis.UniversalClient, want int) ([]leasehold.Event, string) {
	t.Helper()
	var (
		mu     sync.Mutex
		events []leasehold.Event
		logs   syncBuf
	)
	obs := leasehold.ObserverFunc(func(e leasehold.Event) {
		if e.Kind == leasehold.EventConfigWarning {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
	})
	st := newStore(t, c, redisstore.Options{})
	l, err := leasehold.New(st, leasehold.Options{Name: "approval", Observer: obs,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(t.Context(), "config-check")
	if err != nil {
		t.Fatal(err)
	}
	lease.Release(t.Context())
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n >= want && (st.EvictedSeen() != 0 || logs.String() != "") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected the settings check to report %d warning(s) within 10s, got %d", want, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return events, logs.String()
}

// A Locker warns once, with one log line and one event, about a Redis
// that can evict lock keys; not about one with noeviction; and says that it
// could not check under the service ACL (no INFO).
func TestConfigWarningEviction(t *testing.T) {
	srv := testredis.Start(t, "--maxmemory", "3mb", "--maxmemory-policy", "volatile-ttl")
	admin := srv.Client(t)

	events, logs := checkedLocker(t, admin, 1)
	if len(events) != 1 || events[0].Op != "redis_eviction" || events[0].Locker != "approval" ||
		!strings.Contains(events[0].Err.Error(), "volatile-ttl") {
		t.Fatalf("expected one redis_eviction warning, got %+v", events)
	}
	if strings.Count(logs, "store setting can lose locks") != 1 || !strings.Contains(logs, "maxmemory-policy noeviction") {
		t.Fatalf("expected one warning log line with the fix, got %q", logs)
	}

	if err := admin.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if events, logs := checkedLocker(t, admin, 0); len(events) != 0 || logs != "" {
		t.Fatalf("expected no warning under noeviction, got %+v %q", events, logs)
	}

	args := []any{"ACL", "SETUSER", "lh", "on", ">s3cret-pass"}
	for _, f := range strings.Fields(aclRule) {
		args = append(args, f)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(t.Context(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	svc := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Username: "lh", Password: "s3cret-pass"})
	t.Cleanup(func() { _ = svc.Close() })
	events, logs = checkedLocker(t, svc, 0)
	if len(events) != 0 || !strings.Contains(logs, "store settings not checked") || !strings.Contains(logs, "+info") {
		t.Fatalf("expected a skipped check naming +info, got %+v %q", events, logs)
	}
}

// A lease lost to eviction says so: its cause and its EventLost match
// redisstore.ErrEvicted. A lock deleted without eviction does not.
func TestLostToEviction(t *testing.T) {
	srv := testredis.Start(t, "--maxmemory", "3mb", "--maxmemory-policy", "volatile-ttl")
	c := srv.Client(t)
	lostErrs := make(chan error, 4)
	obs := leasehold.ObserverFunc(func(e leasehold.Event) {
		if e.Kind == leasehold.EventLost {
			lostErrs <- e.Err
		}
	})
	st := newStore(t, c, redisstore.Options{})
	l, err := leasehold.New(st, leasehold.Options{TTL: 30 * time.Second, RenewInterval: 200 * time.Millisecond, Observer: obs,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	lose := func(key string, evict bool) error {
		t.Helper()
		lease, err := l.TryAcquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(context.Background())
		// The background settings check reads evicted_keys first.
		deadline := time.Now().Add(10 * time.Second)
		for st.EvictedSeen() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if !evict {
			c.Del(t.Context(), st.LockKey(key))
		}
		val := strings.Repeat("x", 1024)
		for i := 0; evict && c.Exists(t.Context(), st.LockKey(key)).Val() == 1; i++ {
			if i > 16*1024 {
				t.Fatal("expected the lock key to be evicted, got it kept after 16 MiB of cache writes")
			}
			c.Set(t.Context(), fmt.Sprintf("cache:%s:%d", key, i), val, time.Hour)
		}
		select {
		case <-lease.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("expected the lease to be lost at its next renewal, got it still held")
		}
		if got := <-lostErrs; !errors.Is(got, lease.Err()) {
			t.Fatalf("expected EventLost to carry the lease's cause %v, got %v", lease.Err(), got)
		}
		return lease.Err()
	}
	if err := lose("evicted", true); !errors.Is(err, leasehold.ErrLeaseLost) || !errors.Is(err, redisstore.ErrEvicted) {
		t.Fatalf("expected a lease lost to eviction, got %v", err)
	}
	if err := c.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := lose("deleted", false); !errors.Is(err, leasehold.ErrLeaseLost) || errors.Is(err, redisstore.ErrEvicted) {
		t.Fatalf("expected a lease lost without eviction, got %v", err)
	}
}
