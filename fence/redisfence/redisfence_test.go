package redisfence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/internal/resourcetest"
	"github.com/leasehold/leasehold/fence/redisfence"
	"github.com/leasehold/leasehold/fencetest"
	"github.com/leasehold/leasehold/internal/testredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var redisDB atomic.Int64

func TestRedis(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)

	mk := func(t *testing.T) resourcetest.Subject {
		// A fresh logical database per subject keeps keys apart.
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, DB: int(1 + redisDB.Add(1)%15)})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.FlushDB(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		obs := &resourcetest.Counter{}
		r, err := redisfence.NewRedis(c, redisfence.RedisOptions{Name: "approval", Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		return resourcetest.Subject{Res: r, Read: r.Read, Obs: obs, Resource: "redis"}
	}
	t.Run("Conformance", func(t *testing.T) { resourcetest.Run(t, mk) })

	t.Run("Layout", func(t *testing.T) {
		ctx := t.Context()
		r, _ := redisfence.NewRedis(client, redisfence.RedisOptions{})
		if err := r.Write(ctx, "layout", 77, []byte("payload")); err != nil {
			t.Fatal(err)
		}
		got, err := client.HGetAll(ctx, "layout").Result()
		if err != nil || got["value"] != "payload" || got["fence"] != "77" || len(got) != 2 {
			t.Fatalf("expected hash {value: payload, fence: 77}, got %v (%v)", got, err)
		}
		if ttl := client.PTTL(ctx, "layout").Val(); ttl != -1 {
			t.Fatalf("expected no expiry without Expiration, got %v", ttl)
		}
	})

	t.Run("BeyondFloat64", func(t *testing.T) {
		// 2^53+1 and 2^53 are the same float64: a tonumber comparison in Lua
		// would accept the stale write.
		ctx := t.Context()
		r, _ := redisfence.NewRedis(client, redisfence.RedisOptions{})
		const hi = uint64(1)<<53 + 1
		if err := r.Write(ctx, "big", hi, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if err := r.Write(ctx, "big", hi-1, []byte("lo")); !errors.Is(err, fence.ErrStaleFence) {
			t.Fatalf("fence 2^53 after 2^53+1: expected ErrStaleFence, got %v", err)
		}
		if err := r.Write(ctx, "big", 99, []byte("short")); !errors.Is(err, fence.ErrStaleFence) {
			t.Fatalf("shorter decimal: expected ErrStaleFence, got %v", err)
		}
		if err := r.Write(ctx, "big", math.MaxUint64, []byte("max")); err != nil {
			t.Fatalf("fence MaxUint64: %v", err)
		}
		if v, f, err := r.Read(ctx, "big"); err != nil || string(v) != "max" || f != math.MaxUint64 {
			t.Fatalf("expected max@%d, got %q@%d (%v)", uint64(math.MaxUint64), v, f, err)
		}
		var se *fence.StaleError
		if err := r.Write(ctx, "big", hi, nil); !errors.As(err, &se) || se.Current != math.MaxUint64 {
			t.Fatalf("expected StaleError with Current MaxUint64, got %v", err)
		}
	})

	t.Run("Expiration", func(t *testing.T) {
		ctx := t.Context()
		r, err := redisfence.NewRedis(client, redisfence.RedisOptions{Expiration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Write(ctx, "exp", 1, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if ttl := client.PTTL(ctx, "exp").Val(); ttl <= 50*time.Second || ttl > time.Minute {
			t.Fatalf("expected an expiry near 1m, got %v", ttl)
		}
		for _, bad := range []time.Duration{-1, time.Microsecond} {
			if _, err := redisfence.NewRedis(client, redisfence.RedisOptions{Expiration: bad}); !errors.Is(err, fence.ErrInvalidOptions) {
				t.Fatalf("Expiration %v: expected ErrInvalidOptions, got %v", bad, err)
			}
		}
		if _, err := redisfence.NewRedis(nil, redisfence.RedisOptions{}); !errors.Is(err, fence.ErrInvalidOptions) {
			t.Fatalf("nil client: expected ErrInvalidOptions, got %v", err)
		}
	})

	t.Run("WrongTypeIsNotStale", func(t *testing.T) {
		ctx := t.Context()
		client.Set(ctx, "plain", "x", 0)
		r, _ := redisfence.NewRedis(client, redisfence.RedisOptions{})
		err := r.Write(ctx, "plain", 1, []byte("v"))
		if err == nil || errors.Is(err, fence.ErrStaleFence) {
			t.Fatalf("expected a WRONGTYPE error that is not stale, got %v", err)
		}
	})

	t.Run("ScriptFlushed", func(t *testing.T) {
		// EVALSHA falls back to EVAL after SCRIPT FLUSH (or a restart).
		ctx := t.Context()
		r, _ := redisfence.NewRedis(client, redisfence.RedisOptions{})
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.Write(ctx, "flushed", 4, []byte("v")); err != nil {
			t.Fatalf("write after SCRIPT FLUSH: %v", err)
		}
	})

	t.Run("ServerDown", func(t *testing.T) {
		srv2 := testredis.Start(t)
		c := srv2.Client(t)
		r, _ := redisfence.NewRedis(c, redisfence.RedisOptions{})
		srv2.Stop()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		err := r.Write(ctx, "k", 1, []byte("v"))
		if err == nil || errors.Is(err, fence.ErrStaleFence) {
			t.Fatalf("expected a connection error that is not stale, got %v", err)
		}
	})
}

// flakyScripter fails every call: a resource error must never look stale.
type flakyScripter struct{ redis.Scripter }

func (flakyScripter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(fmt.Errorf("injected: %s", strconv.Quote("connection reset")))
	return cmd
}

func (f flakyScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return f.EvalSha(ctx, "", keys, args...)
}

func TestRedisInjectedFailure(t *testing.T) {
	obs := &resourcetest.Counter{}
	r, err := redisfence.NewRedis(flakyScripter{}, redisfence.RedisOptions{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Write(t.Context(), "k", 1, nil)
	if err == nil || errors.Is(err, fence.ErrStaleFence) {
		t.Fatalf("expected the injected error, got %v", err)
	}
	if len(obs.Stale()) != 0 {
		t.Fatal("a failed write must not be counted as stale")
	}
}

// fencetest drives the Redis resource like a fleet of lease holders, some
// paused past their TTL, and checks the history with porcupine.
func TestRedisHistory(t *testing.T) {
	srv := testredis.Start(t)
	r, err := redisfence.NewRedis(srv.Client(t), redisfence.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := fencetest.Run(t.Context(), r, r.Read, fencetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ops: %d accepted, %d rejected as stale", len(res.Ops), res.Accepted, res.Rejected)
}
