package etcdstore_test

import (
	"testing"

	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// TestMain checks for leaked goroutines (goleak), allowing embedded etcd
// members' peer connections a few seconds to close (see testetcd.LeakWait).
func TestMain(m *testing.M) {
	testetcd.VerifyTestMain(m)
}
