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
	"github.com/leasehold/leasehold/storetest"
)

// aclRule is the ACL documented in README.md (minus the user name
// and password).
const aclRule = "resetkeys ~leasehold:* resetchannels &leasehold:* -@all " +
	"+evalsha +eval +get +set +pexpire +pttl +del +exists +hget +hgetall +hset +hdel +hincrby +zadd +zcard +zrange +zrank +zrem +publish +spublish +time " +
	"+scan +subscribe +unsubscribe +ssubscribe +sunsubscribe +ping"

// TestACLRestrictedUser runs the conformance suite as a user that may only
// touch the prefix's keys and channel with the commands the store needs.
func TestACLRestrictedUser(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.Client(t)
	args := []any{"ACL", "SETUSER", "lh", "on", ">s3cret-pass"}
	for _, f := range strings.Fields(aclRule) {
		args = append(args, f)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	user := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Username: "lh", Password: "s3cret-pass"})
	t.Cleanup(func() { _ = user.Close() })
	if err := user.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING as lh: %v", err)
	}
	// The restriction is real: other keys, channels and commands are refused.
	if err := user.Set(t.Context(), "other:key", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("SET outside the prefix: expected NOPERM, got %v", err)
	}
	if err := user.Publish(t.Context(), "other:released", "x").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("PUBLISH outside the prefix: expected NOPERM, got %v", err)
	}
	if err := user.FlushAll(t.Context()).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("FLUSHALL: expected NOPERM, got %v", err)
	}
	other := newStore(t, user, redisstore.Options{Prefix: "other:"})
	_, err := other.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second})
	if err == nil || errors.Is(err, leasehold.ErrNotAcquired) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Acquire under a forbidden prefix: expected a NOPERM store error, got %v", err)
	}

	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return newStore(t, user, redisstore.Options{}) },
	})
}
