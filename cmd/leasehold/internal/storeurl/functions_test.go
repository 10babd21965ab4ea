package storeurl_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
)

// TestRedisFunctions loads the library as an operator, then opens the store
// with functions=true as a user that has +fcall and no +eval.
func TestRedisFunctions(t *testing.T) {
	srv := testredis.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rule := []any{"ACL", "SETUSER", "svc", "on", ">svc-QZJpw", "resetkeys", "~leasehold:*", "resetchannels", "&leasehold:*", "-@all",
		"+fcall", "+get", "+set", "+pexpire", "+pttl", "+del", "+exists", "+hget", "+hgetall", "+hset", "+hdel", "+hincrby", "+zadd", "+zcard", "+zrange", "+zrank", "+zrem",
		"+publish", "+spublish", "+time", "+subscribe", "+ssubscribe"}
	if err := srv.Client(t).Do(ctx, rule...).Err(); err != nil {
		t.Fatal(err)
	}
	svcURL := "redis://svc:svc-QZJpw@" + srv.Addr + "?functions=true"
	o, err := storeurl.Open(ctx, svcURL)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	_, err = o.Store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second})
	if !errors.Is(err, leasehold.ErrMisconfigured) {
		t.Fatalf("before setup: expected ErrMisconfigured, got %v", err)
	}
	if _, err := storeurl.LoadRedisFunctions(ctx, "redis://svc:svc-QZJpw@"+srv.Addr, nil); err == nil || strings.Contains(err.Error(), "QZJ") {
		t.Errorf("FUNCTION LOAD as the service user: expected a refusal without the password, got %v", err)
	}
	if _, err := storeurl.LoadRedisFunctions(ctx, srv.URL(), func(string) string { return "" }); err != nil {
		t.Fatalf("LoadRedisFunctions: %v", err)
	}
	if _, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatalf("after setup: %v", err)
	}
	if _, err := storeurl.LoadRedisFunctions(ctx, "etcd://127.0.0.1:1", nil); !errors.Is(err, storeurl.ErrBadURL) {
		t.Errorf("an etcd URL: expected ErrBadURL, got %v", err)
	}
}
