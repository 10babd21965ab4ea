package storetest_test

import (
	"testing"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/storetest"
)

// A store's conformance test: Run in a TestXxx function of the store's
// package, with a Harness that hands out stores over the real server. The
// memory store needs no server; a network store's New connects to one the
// test started, and Break/Heal or Freeze stop it for the failure subtests.
func ExampleRun() {
	testConformance := func(t *testing.T) {
		storetest.Run(t, storetest.Harness{
			New: func(t *testing.T) driver.Store { return memstore.New() },
			// One store is every replica: it is in-process.
			Replica: func(t *testing.T, s driver.Store) driver.Store { return s },
		})
	}
	_ = testConformance // in a _test.go file: func TestConformance(t *testing.T) { ... }
}
