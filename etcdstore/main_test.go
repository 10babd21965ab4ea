package etcdstore_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// TestMain checks for leaked goroutines (goleak), allowing embedded etcd
// members' peer connections a few seconds to close (see testetcd.LeakWait).
//
// One goroutine of the embedded etcd server itself is ignored: a peer's
// /version request that reaches a member while it stops blocks for ever on
// the closed backend's lock (seen once in a full `make test`, 1 minute after
// the cluster stopped). It belongs to the test's etcd server, not to the
// store: nothing of etcdstore or the client is on its stack.
func TestMain(m *testing.M) {
	testetcd.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"))
}
