// Package netnstest wraps package netns for tests: it skips a test where
// namespaces cannot be created, removes the network in the test's cleanup,
// and fails the test when a cut or heal fails.
package netnstest

import (
	"testing"

	"github.com/leasehold/leasehold/internal/netns"
)

// Net is a netns.Net bound to a test.
type Net struct {
	*netns.Net
	tb testing.TB
}

// New creates a netns.Net of n nodes and closes it in tb.Cleanup, after the
// test's own cleanups registered later (so processes started in the nodes
// are stopped first). It skips the test, saying why, when namespaces cannot
// be created here.
func New(tb testing.TB, n int) *Net {
	tb.Helper()
	nt, err := netns.New(n)
	if err != nil {
		tb.Skipf("%v", err)
	}
	tb.Cleanup(nt.Close)
	return &Net{Net: nt, tb: tb}
}

// Skip skips the test when namespaces are unavailable here (before it
// starts anything else).
func Skip(tb testing.TB) {
	tb.Helper()
	if err := netns.Available(); err != nil {
		tb.Skipf("%v", err)
	}
}

// Cut partitions node i, failing the test if it cannot.
func (n *Net) Cut(i int) {
	n.tb.Helper()
	if err := n.Net.Cut(i); err != nil {
		n.tb.Fatal(err)
	}
}

// Heal reconnects node i, failing the test if it cannot.
func (n *Net) Heal(i int) {
	n.tb.Helper()
	if err := n.Net.Heal(i); err != nil {
		n.tb.Fatal(err)
	}
}
