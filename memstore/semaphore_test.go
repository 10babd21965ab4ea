package memstore_test

import (
	"testing"

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
