package redisstore_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// TestFailoverClientLeavesCutSentinel shows the go-redis lag that
// TuneFailover fixes. Two failover clients on node 1 are given only node
// 0's sentinel, so that is the one each keeps (go-redis discovers the other
// two from it). Node 0 (the master and that sentinel) is cut off; the
// sentinels of nodes 1 and 2 promote a replica. The tuned client must write
// to the new master within 5 s of the sentinels naming it; the untuned one
// (go-redis defaults with DialTimeout 500 ms) is only measured: it kept
// asking the unreachable sentinel, each ask ending with the dial's
// deadline, which go-redis does not count against the sentinel.
//
// It needs root and takes 15-40 s: set LEASEHOLD_REDIS_PARTITION=1.
func TestFailoverClientLeavesCutSentinel(t *testing.T) {
	if os.Getenv("LEASEHOLD_REDIS_PARTITION") == "" {
		t.Skip("set LEASEHOLD_REDIS_PARTITION=1 to run the Redis partition tests (needs root)")
	}
	t.Cleanup(waitDialProbes)
	g := testredis.StartNetSentinel(t)
	newClient := func(tune bool) *redis.Client {
		o := g.Options(1)
		o.SentinelAddrs = []string{g.Sentinels[0]}
		if tune {
			redisstore.TuneFailover(o)
		}
		c := redis.NewFailoverClient(o)
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Set(t.Context(), "lag", "before", 0).Err(); err != nil {
			t.Fatalf("write before the cut: %v", err)
		}
		return c
	}
	tuned, untuned := newClient(true), newClient(false)
	cut := time.Now()
	g.Net.Cut(0)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	switched := waitSwitch(ctx, g, cut)
	if switched == 0 {
		t.Fatal("node 1's sentinel named no new master within 60 s of the cut")
	}
	t.Logf("node 1's sentinel named a new master %v after the cut", switched.Round(time.Millisecond))
	var wg sync.WaitGroup
	var lagTuned, lagUntuned time.Duration
	wg.Go(func() { lagTuned = firstWrite(ctx, tuned, cut.Add(switched), 15*time.Second) })
	wg.Go(func() { lagUntuned = firstWrite(ctx, untuned, cut.Add(switched), 15*time.Second) })
	wg.Wait()
	t.Logf("first write to the new master after the sentinels named it: tuned client %v, untuned client %v (-1: none within 15 s)",
		lagTuned.Round(time.Millisecond), lagUntuned.Round(time.Millisecond))
	if lagTuned < 0 || lagTuned > 5*time.Second {
		t.Errorf("the tuned client wrote to the new master %v after the sentinels named it (-1: not within 15 s); want within 5 s", lagTuned)
	}
	g.Net.Heal(0)
}

// firstWrite writes with c until a write succeeds or limit has passed since
// from, and returns how long after from it succeeded, or -1.
func firstWrite(ctx context.Context, c *redis.Client, from time.Time, limit time.Duration) time.Duration {
	for time.Since(from) < limit && ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Set(wctx, "lag", "after", 0).Err()
		cancel()
		if err == nil {
			return time.Since(from)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1
}
