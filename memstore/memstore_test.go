package memstore_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New:   storetest.OnePerTest(func(*testing.T) leasehold.Store { return memstore.New() }),
		Break: func(t *testing.T, s leasehold.Store) { s.(*memstore.Store).SetDown(true) },
		Heal:  func(t *testing.T, s leasehold.Store) { s.(*memstore.Store).SetDown(false) },
	})
}
