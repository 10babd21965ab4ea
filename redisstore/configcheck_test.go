package redisstore_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

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

// checkedLocker takes one lock through a Locker over c, closes it (which
// waits for the background settings check) and returns the config
// warnings it observed and its log.
func checkedLocker(t *testing.T, c redis.UniversalClient) ([]leasehold.Event, string) {
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

	events, logs := checkedLocker(t, admin)
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
	if events, logs := checkedLocker(t, admin); len(events) != 0 || logs != "" {
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
	svc := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "lh", Password: "s3cret-pass"})
	t.Cleanup(func() { _ = svc.Close() })
	events, logs = checkedLocker(t, svc)
	if len(events) != 0 || !strings.Contains(logs, "store settings not checked") || !strings.Contains(logs, "+info") {
		t.Fatalf("expected a skipped check naming +info, got %+v %q", events, logs)
	}
}
