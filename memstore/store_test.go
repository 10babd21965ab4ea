package memstore_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New:   storetest.OnePerTest(func(*testing.T) driver.Store { return memstore.New() }),
		Break: func(t *testing.T, s driver.Store) { s.(*memstore.Store).SetDown(true) },
		Heal:  func(t *testing.T, s driver.Store) { s.(*memstore.Store).SetDown(false) },
		// Replicas of an in-process store share it, as goroutines of one
		// process do.
		Replica: func(t *testing.T, s driver.Store) driver.Store { return s },
		Freeze: func(t *testing.T, s driver.Store) func() {
			return hang(s.(*memstore.Store), func(memstore.Op) bool { return true })
		},
		HangNotify: func(t *testing.T, s driver.Store) func() {
			return hang(s.(*memstore.Store), func(op memstore.Op) bool { return op == memstore.OpWaitRelease })
		},
	})
}

// hang stalls the operations that match until their context ends.
func hang(s *memstore.Store, match func(memstore.Op) bool) (undo func()) {
	s.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if match(op) {
			return memstore.Fault{Delay: time.Hour}
		}
		return memstore.Fault{}
	})
	return func() { s.SetFaults(nil) }
}

// TestLiveness runs storetest's randomized liveness test: replicas share one
// store, as goroutines of one process do.
func TestLiveness(t *testing.T) {
	storetest.RunLiveness(t, storetest.Harness{
		New:     storetest.OnePerTest(func(*testing.T) driver.Store { return memstore.New() }),
		Replica: func(t *testing.T, s driver.Store) driver.Store { return s },
	}, 20*time.Second)
}

// TestFenceRisesAcrossRestart: the fence counter is one for every key, so it
// can run ahead of the clock (many grants within a microsecond, or a clock
// that stands still, as in a synctest bubble); a Restart must not bring a
// key's fence back to the clock floor below fences already handed out.
func TestFenceRisesAcrossRestart(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	s := memstore.New(memstore.WithClock(func() time.Time { return at }))
	ctx := t.Context()
	var last uint64
	grant := func(key string) {
		t.Helper()
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= last {
			t.Fatalf("expected a fence above %d, got %d", last, g.Fence)
		}
		last = g.Fence
		if err := s.Release(ctx, key, "t"); err != nil {
			t.Fatal(err)
		}
		p, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: key, Token: "t", TTL: time.Minute, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if p.Fence <= last {
			t.Fatalf("permit: expected a fence above %d, got %d", last, p.Fence)
		}
		last = p.Fence
		if err := s.ReleasePermit(ctx, key, "t"); err != nil {
			t.Fatal(err)
		}
	}
	grant("k")
	grant("k")
	s.Restart()
	grant("k")
}
