package redisstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// Configuration mistakes are errors wrapping leasehold.ErrMisconfigured,
// never contention and never a transient failure, so a FailOpen Locker does
// not run work without a lock on them. Each case is a real server refusing.
func TestMisconfigurationErrors(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "right-pass-123")
	admin := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Password: "right-pass-123"})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := t.Context()
	// A user that may use the commands but not the store's keys (another prefix).
	if err := admin.Do(ctx, "ACL", "SETUSER", "narrow", "on", ">narrow-pass-1", "resetkeys", "~other:*",
		"resetchannels", "&other:*", "-@all", "+evalsha", "+eval", "+get", "+set", "+exists", "+ping").Err(); err != nil {
		t.Fatal(err)
	}
	client := func(o redis.Options) *redis.Client {
		o.Addr, o.ContextTimeoutEnabled = srv.Addr, true
		c := redis.NewClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	good := newStore(t, admin, redisstore.Options{})
	if err := admin.HSet(ctx, good.LockKey("hash"), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.HSet(ctx, good.FenceKey("hashfence"), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		c       *redis.Client
		key     string
		want    string
		release error // what Release then says
	}{
		{"wrong password", client(redis.Options{ContextTimeoutEnabled: true, Password: "wrong-pass-456"}), "k", "WRONGPASS", leasehold.ErrMisconfigured},
		{"no password", client(redis.Options{ContextTimeoutEnabled: true}), "k", "NOAUTH", leasehold.ErrMisconfigured},
		{"ACL denies the prefix", client(redis.Options{ContextTimeoutEnabled: true, Username: "narrow", Password: "narrow-pass-1"}), "k", "NOPERM", leasehold.ErrMisconfigured},
		{"database that does not exist", client(redis.Options{ContextTimeoutEnabled: true, Password: "right-pass-123", DB: 99}), "k", "DB index", leasehold.ErrMisconfigured},
		{"lock key of another type", admin, "hash", "WRONGTYPE", leasehold.ErrMisconfigured},
		{"fence key of another type", admin, "hashfence", "WRONGTYPE", leasehold.ErrNotHeld}, // no lock left behind
	} {
		s := newStore(t, tc.c, redisstore.Options{})
		_, err := s.Acquire(ctx, driver.AcquireRequest{Key: tc.key, Token: "t", TTL: time.Minute})
		if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrNotAcquired) {
			t.Errorf("%s: expected an error wrapping ErrMisconfigured, got %v", tc.name, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: expected the error to say %s, got %v", tc.name, tc.want, err)
		}
		if strings.Contains(err.Error(), "pass-") {
			t.Errorf("%s: the error shows a password: %v", tc.name, err)
		}
		if err := s.Release(ctx, tc.key, "t"); !errors.Is(err, tc.release) {
			t.Errorf("%s: Release: expected %v, got %v", tc.name, tc.release, err)
		}
	}
}

// A FailOpen Locker fails closed on a configuration error: a wrong password
// never hands out a degraded lease.
func TestMisconfigurationFailsClosed(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "right-pass-123")
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Password: "wrong-pass-456"})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{})
	lk, err := leasehold.New(s, leasehold.Options{Name: "misconfigured", OnStoreError: leasehold.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	l, err := lk.TryAcquire(t.Context(), "k")
	if err == nil {
		_ = l.Release(t.Context())
		t.Fatalf("FailOpen Locker with a wrong password: expected an error, got a lease (degraded %v)", l.Degraded())
	}
	if !errors.Is(err, leasehold.ErrMisconfigured) || !errors.Is(err, leasehold.ErrStore) {
		t.Fatalf("FailOpen Locker with a wrong password: expected ErrMisconfigured and ErrStore, got %v", err)
	}
}
