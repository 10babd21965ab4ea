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
