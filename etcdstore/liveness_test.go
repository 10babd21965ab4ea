package etcdstore_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/storetest"
)

// TestLiveness runs storetest's randomized liveness test: each replica is a
// Store with its own client of one member.
func TestLiveness(t *testing.T) {
	c := testetcd.Start(t)
	storetest.RunLiveness(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return newStore(t, c) },
		// etcd deletes what nobody renews with its lease: up to 1 s after the
		// TTL rounded up to whole seconds, plus etcd's 500 ms check.
		Slack: 3 * time.Second,
	}, 40*time.Second)
}
