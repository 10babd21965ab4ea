package redisstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// TestMasterPartition cuts the Redis master, its sentinel and holder A (a
// client on the master's node) away from the two replicas, their sentinels
// and waiter B (testredis.StartNetSentinel: one network namespace per
// node). The majority's sentinels promote a replica; B is granted the key
// there once A's replicated lock expires. A still reaches the old master,
// which accepts its renewals unless it is configured to refuse writes
// without replicas (min-replicas-to-write). Measured: when B was granted,
// how long A kept trusting its lease after that (until the heal, 3 s after
// B's grant, demotes the old master, or until min-replicas-to-write made its
// renewals fail), and the stale writes the fence rejected. Checked: B's fence
// is greater than A's, and the register accepts none of A's writes after
// B's.
func TestMasterPartition(t *testing.T) {
	cases := []struct {
		name string
		args []string
	}{
		{"default", nil},
		{"min-replicas-to-write", []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"}},
	}
	t.Cleanup(waitDialProbes)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := testredis.StartNetSentinel(t, tc.args...)
			res := masterPartitionRun(t, g)
			t.Logf("%s: B granted %v after the cut; A trusted its lease %v after B's grant (%v); fences %d -> %d; A's writes rejected as stale %d, accepted after B's first write %d",
				tc.name, res.granted.Round(time.Millisecond), res.overlap.Round(time.Millisecond), res.cause,
				res.fenceA, res.fenceB, res.rejected, res.staleAccepted)
			if res.fenceB <= res.fenceA {
				t.Errorf("fence went backward: A %d, B %d", res.fenceA, res.fenceB)
			}
			if res.staleAccepted > 0 {
				t.Errorf("the register accepted %d of A's writes after B had written", res.staleAccepted)
			}
		})
	}
}

type partitionResult struct {
	granted, overlap time.Duration
	cause            error
	fenceA, fenceB   uint64
	rejected         uint64
	staleAccepted    int
}

func partitionLocker(t *testing.T, g *testredis.NetSentinel, node int, name string) *leasehold.Locker {
	t.Helper()
	s := newStore(t, g.Client(t, node), redisstore.Options{})
	lk, err := leasehold.New(s, leasehold.Options{Name: name, TTL: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	return lk
}

func masterPartitionRun(t *testing.T, g *testredis.NetSentinel) partitionResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const key = "partition"
	lkA := partitionLocker(t, g, 0, "holder-a")
	lkB := partitionLocker(t, g, 1, "waiter-b")
	leaseA, err := lkA.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("A: %v", err)
	}
	var res partitionResult
	res.fenceA = leaseA.Fence()
	var newest uint64
	reg := fence.NewRegister(fence.RegisterOptions{OnWrite: func(w fence.Record) {
		if w.Accepted && w.Fence < newest {
			res.staleAccepted++
		}
		newest = max(newest, w.Fence)
	}})
	var wg sync.WaitGroup
	defer wg.Wait()
	stopped := make(chan time.Time, 1)
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-leaseA.Done():
				stopped <- time.Now()
				return
			case <-tick.C:
				_ = fence.Write(ctx, reg, leaseA, key, []byte("a"))
			}
		}
	})
	type grant struct {
		lease *leasehold.Lease
		at    time.Time
		err   error
	}
	granted := make(chan grant, 1)
	wg.Go(func() {
		for {
			l, err := lkB.Acquire(ctx, key)
			if err != nil && errors.Is(err, leasehold.ErrStore) && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond) // the failover: ask again
				continue
			}
			granted <- grant{l, time.Now(), err}
			return
		}
	})
	time.Sleep(time.Second)
	cut := time.Now()
	g.Net.Cut(0)
	b := <-granted
	if b.err != nil {
		t.Fatalf("B: no grant %v after the cut: %v", time.Since(cut), b.err)
	}
	res.granted, res.fenceB = b.at.Sub(cut), b.lease.Fence()
	wg.Go(func() { // B writes while it holds
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-b.lease.Done():
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = fence.Write(ctx, reg, b.lease, key, []byte("b"))
			}
		}
	})
	var aStop time.Time
	select {
	case aStop = <-stopped:
	case <-time.After(3 * time.Second):
		g.Net.Heal(0) // the old master learns of the new one and becomes its replica
		select {
		case aStop = <-stopped:
		case <-time.After(30 * time.Second):
			t.Fatal("A still trusts its lease 30 s after the heal")
		}
	}
	res.overlap = max(0, aStop.Sub(b.at))
	res.cause = leaseA.Err()
	_, res.rejected = reg.Stats()
	_ = b.lease.Release(ctx)
	cancel()
	wg.Wait()
	return res
}

// waitDialProbes waits (up to 5 s) for go-redis's dial probes to end: after
// a failed dial a pool probes once a second until it is closed, so a probe
// may outlive the test by a second.
func waitDialProbes() {
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		if !strings.Contains(string(buf[:n]), "pool.(*ConnPool).tryDial") && !strings.Contains(string(buf[:n]), "pool.(*ConnPool).queuedNewConn") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
