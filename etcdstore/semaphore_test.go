package etcdstore_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/storetest"
)

// TestSemaphoreConformance runs the semaphore suite with every instance on
// its own etcd client. etcd leases count whole seconds: TTLs of 1 s.
func TestSemaphoreConformance(t *testing.T) {
	c := testetcd.Start(t)
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New: func(t *testing.T) leasehold.Semaphorer {
			// A longer request timeout: a burst of acquirers on one key
			// retries its optimistic transaction.
			s, err := etcdstore.New(c.Client(t), etcdstore.Options{Prefix: "lh-test/", RequestTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Break:  func(t *testing.T, _ leasehold.Semaphorer) { c.Kill(0) },
		Heal:   func(t *testing.T, _ leasehold.Semaphorer) { c.Restart(0) },
		Slack:  2 * time.Second,
		MinTTL: time.Second,
	})
}
