package memstore_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

func waiting(key, token string, queueTTL time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: token, TTL: time.Minute, Holder: "p-" + token, QueueTTL: queueTTL}
}

// A waiter's place lasts exactly its queue TTL after its last acquire.
func TestQueueEntryLastsItsQueueTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New()
		ctx := t.Context()
		if _, err := s.Acquire(ctx, waiting("k", "h", 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, waiting("k", "dead", time.Second)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("expected ErrNotAcquired, got %v", err)
		}
		time.Sleep(500 * time.Millisecond)
		if _, err := s.Acquire(ctx, waiting("k", "dead", time.Second)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("refresh: expected ErrNotAcquired, got %v", err)
		}
		if err := s.Release(ctx, "k", "h"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second - time.Nanosecond) // the refresh moved the deadline to 1.5 s
		g, err := s.Acquire(ctx, waiting("k", "live", time.Minute))
		if !errors.Is(err, driver.ErrNotAcquired) || g.Ahead != 1 {
			t.Fatalf("before the dead waiter's deadline: expected ErrNotAcquired with 1 ahead, got %+v, %v", g, err)
		}
		time.Sleep(time.Nanosecond)
		if _, err := s.Acquire(ctx, waiting("k", "live", time.Minute)); err != nil {
			t.Fatalf("at the dead waiter's deadline: expected the grant, got %v", err)
		}
		info, err := s.Inspect(ctx, "k")
		if err != nil || info.Holder != "p-live" || info.Waiting != 0 {
			t.Fatalf("expected holder p-live and an empty queue, got %+v, %v", info, err)
		}
	})
}

// Restart loses the queue and wakes every waiter; so does the end of an
// outage (a reconnected notification path).
func TestRestartAndRecoveryWakeEveryWaiter(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	a, stopA, _ := s.WaitRelease(ctx, "a", "t1")
	defer stopA()
	b, stopB, _ := s.WaitRelease(ctx, "b", "t2")
	defer stopB()
	for _, tc := range []struct {
		name string
		do   func()
	}{
		{"Restart", s.Restart},
		{"SetDown(false)", func() { s.SetDown(true); s.SetDown(false) }},
	} {
		tc.do()
		for _, ch := range []<-chan driver.Wake{a, b} {
			select {
			case <-ch:
			default:
				t.Fatalf("%s: expected every waiter woken", tc.name)
			}
		}
	}
}

// A stalled subscription ends with its context; a dropped acquire reply
// is a store failure, not contention, even where the store refused.
func TestWaitReleaseAndAcquireFaults(t *testing.T) {
	s := memstore.New()
	s.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		switch op {
		case memstore.OpWaitRelease:
			return memstore.Fault{Delay: time.Hour}
		case memstore.OpAcquire:
			return memstore.Fault{DropReply: true}
		}
		return memstore.Fault{}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := s.WaitRelease(ctx, "k", "t"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled WaitRelease: expected DeadlineExceeded, got %v", err)
	}
	for _, tok := range []string{"t", "u"} { // a grant, then a refusal: both replies are lost
		if _, err := s.Acquire(t.Context(), waiting("k", tok, time.Minute)); !errors.Is(err, memstore.ErrReplyLost) {
			t.Fatalf("acquire by %s with a dropped reply: expected ErrReplyLost, got %v", tok, err)
		}
	}
}

// ForceRelease has a fault of its own: a fault on OpForceRelease fails the
// force release and not a Release, and one on OpRelease the other way round.
func TestForceReleaseFaultsApartFromRelease(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	for _, op := range []memstore.Op{memstore.OpForceRelease, memstore.OpRelease} {
		s.SetFaults(nil)
		for _, k := range []string{"a", "b"} {
			if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "t", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		s.SetFaults(func(o memstore.Op, _ string) memstore.Fault {
			if o == op {
				return memstore.Fault{Err: memstore.ErrUnavailable}
			}
			return memstore.Fault{}
		})
		_, forced := s.ForceRelease(ctx, "a")
		released := s.Release(ctx, "b", "t")
		if got, want := errors.Is(forced, memstore.ErrUnavailable), op == memstore.OpForceRelease; got != want {
			t.Fatalf("fault on %s: expected ForceRelease to fail %v, got %v", op, want, forced)
		}
		if got, want := errors.Is(released, memstore.ErrUnavailable), op == memstore.OpRelease; got != want {
			t.Fatalf("fault on %s: expected Release to fail %v, got %v", op, want, released)
		}
	}
}
