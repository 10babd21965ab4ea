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

// The least-privilege ACLs of README.md (Functions mode), minus the user
// name and password. The service may not EVAL, SCAN, PING or unsubscribe;
// the operator (ls, inspect, force release) may also SCAN.
const (
	serviceACL = "resetkeys ~leasehold:* resetchannels &leasehold:* -@all " +
		"+fcall +fcall_ro +get +set +pexpire +pttl +del +exists +hget +hgetall +hset +hdel +hincrby +zadd +zcard +zrange +zrank +zrem +publish +spublish +time " +
		"+subscribe +ssubscribe"
	operatorACL = serviceACL + " +scan"
	// semaphoreACL is what semaphores (Locker.Semaphore) add.
	semaphoreACL = " +lrange +lrem +rpush +zrangebyscore +zremrangebyscore +zscore"
)

func aclUser(t *testing.T, srv *testredis.Server, name, rule string) *redis.Client {
	t.Helper()
	args := []any{"ACL", "SETUSER", name, "on", ">pw-" + name}
	for _, f := range strings.Fields(rule) {
		args = append(args, f)
	}
	if err := srv.Client(t).Do(t.Context(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: name, Password: "pw-" + name, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestFunctionsWithoutEval loads the library as the default (admin) user,
// then runs a service user that has +fcall and no +eval.
func TestFunctionsWithoutEval(t *testing.T) {
	srv := testredis.Start(t)
	svc := aclUser(t, srv, "svc", serviceACL)
	ctx := t.Context()

	// Before the library is loaded: a configuration error, not contention.
	st := newStore(t, svc, redisstore.Options{Functions: true})
	_, err := st.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t0", TTL: time.Second})
	if !errors.Is(err, leasehold.ErrMisconfigured) || !strings.Contains(err.Error(), "setup redis") {
		t.Fatalf("without the library: expected ErrMisconfigured naming `leasehold setup redis`, got %v", err)
	}

	if err := redisstore.LoadFunctions(ctx, srv.Client(t)); err != nil {
		t.Fatalf("LoadFunctions: %v", err)
	}
	if err := redisstore.LoadFunctions(ctx, srv.Client(t)); err != nil {
		t.Fatalf("LoadFunctions again (REPLACE): %v", err)
	}
	// The service user really cannot run scripts.
	if err := svc.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("EVAL as the service user: expected NOPERM, got %v", err)
	}
	scripts := newStore(t, svc, redisstore.Options{})
	if _, err := scripts.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t0", TTL: time.Second}); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("a script-mode store as the service user: expected NOPERM, got %v", err)
	}

	g, err := st.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t1", TTL: 5 * time.Second})
	if err != nil || g.Fence == 0 {
		t.Fatalf("acquire with FCALL: fence %d, %v", g.Fence, err)
	}
	if _, err := st.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t2", TTL: 5 * time.Second}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("second holder: expected ErrNotAcquired, got %v", err)
	}
	woke, stop, err := st.WaitRelease(ctx, "k", "t2")
	if err != nil {
		t.Fatalf("WaitRelease: %v", err)
	}
	defer stop()
	select { // a wake-up at once, if any: t1 holds the key, so none is due (see driver.Notifier)
	case <-woke:
	default:
	}
	if err := st.Renew(ctx, "k", "t1", 5*time.Second); err != nil {
		t.Fatalf("renew with FCALL: %v", err)
	}
	if li, err := st.Inspect(ctx, "k"); err != nil || li.Token != "t1" {
		t.Fatalf("inspect with FCALL_RO: %+v, %v", li, err)
	}
	if err := st.Release(ctx, "k", "t1"); err != nil {
		t.Fatalf("release with FCALL: %v", err)
	}
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}

// TestFunctionsConformance runs the conformance suite in Functions mode as
// the operator user (the suite lists keys, which needs SCAN).
func TestFunctionsConformance(t *testing.T) {
	srv := testredis.Start(t)
	if err := redisstore.LoadFunctions(t.Context(), srv.Client(t)); err != nil {
		t.Fatalf("LoadFunctions: %v", err)
	}
	op := aclUser(t, srv, "op", operatorACL)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return newStore(t, op, redisstore.Options{Functions: true}) },
	})
}

func TestLibraryNamesEveryScript(t *testing.T) {
	lib := redisstore.Library()
	for _, name := range []string{"acquire", "renew", "release", "forcerelease", "inspect"} {
		if !strings.Contains(lib, "function_name = '"+redisstore.LibraryName+"_"+name+"_") {
			t.Errorf("Library has no %s function", name)
		}
	}
}

// TestFunctionsSemaphore runs the semaphore suite in Functions mode as the
// operator user. A restart without persistence loses the library, so Heal
// loads it again (as an operator must; see README).
func TestFunctionsSemaphore(t *testing.T) {
	srv := testredis.Start(t)
	if err := redisstore.LoadFunctions(t.Context(), srv.Client(t)); err != nil {
		t.Fatalf("LoadFunctions: %v", err)
	}
	aclUser(t, srv, "op", operatorACL+semaphoreACL)
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New: func(t *testing.T) driver.Semaphorer {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "op", Password: "pw-op", ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			return newStore(t, c, redisstore.Options{Functions: true})
		},
		Break: func(t *testing.T, _ driver.Semaphorer) { srv.Stop() },
		Heal: func(t *testing.T, _ driver.Semaphorer) {
			srv.Restart()
			admin := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
			defer admin.Close()
			if err := admin.Do(t.Context(), append([]any{"ACL", "SETUSER", "op", "on", ">pw-op"}, fieldsAny(operatorACL+semaphoreACL)...)...).Err(); err != nil {
				t.Fatalf("ACL SETUSER after restart: %v", err)
			}
			if err := redisstore.LoadFunctions(t.Context(), admin); err != nil {
				t.Fatalf("LoadFunctions after restart: %v", err)
			}
		},
	})
}

func fieldsAny(s string) []any {
	var out []any
	for _, f := range strings.Fields(s) {
		out = append(out, f)
	}
	return out
}

// TestLoadFunctionsRefusedIsMisconfigured: a user whose ACL does not allow
// FUNCTION gets ErrMisconfigured (NOPERM), which retrying cannot fix.
func TestLoadFunctionsRefusedIsMisconfigured(t *testing.T) {
	srv := testredis.Start(t)
	svc := aclUser(t, srv, "svc", serviceACL)
	err := redisstore.LoadFunctions(t.Context(), svc)
	if !errors.Is(err, leasehold.ErrMisconfigured) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("LoadFunctions as a user without +function: expected ErrMisconfigured (NOPERM), got %v", err)
	}
}
