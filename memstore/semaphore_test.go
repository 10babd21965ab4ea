package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/storetest"
)

func TestSemaphoreConformance(t *testing.T) {
	s := memstore.New()
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New:   func(t *testing.T) driver.Semaphorer { return s },
		Break: func(t *testing.T, _ driver.Semaphorer) { s.SetDown(true) },
		Heal:  func(t *testing.T, _ driver.Semaphorer) { s.SetDown(false) },
	})
}

// TestWaitPermitFaults: an outage and injected faults reach WaitPermit as
// they reach WaitRelease: a permit waiter's notification path can be cut
// or stalled.
func TestWaitPermitFaults(t *testing.T) {
	s := memstore.New()
	s.SetDown(true)
	if _, _, err := s.WaitPermit(t.Context(), "k", "w"); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("WaitPermit during an outage: expected ErrUnavailable, got %v", err)
	}
	s.SetDown(false)
	s.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpWaitPermit {
			return memstore.Fault{Delay: time.Hour}
		}
		return memstore.Fault{}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := s.WaitPermit(ctx, "k", "w"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitPermit on a stalled notification path: expected its context's end, got %v", err)
	}
}
