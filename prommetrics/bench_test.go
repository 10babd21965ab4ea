package prommetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// BenchmarkObserve measures the per-event cost on the hot path: one
// acquire, one held and one contention event per iteration.
func BenchmarkObserve(b *testing.B) {
	obs, err := prommetrics.New(prometheus.NewRegistry(), prommetrics.Options{})
	if err != nil {
		b.Fatal(err)
	}
	acq := leasehold.Event{Kind: leasehold.EventAcquire, Locker: "approval", Key: "job/1", Result: leasehold.ResultAcquired, Duration: 3 * time.Millisecond}
	held := leasehold.Event{Kind: leasehold.EventHeld, Locker: "approval", Key: "job/1", Duration: 2 * time.Second, Err: leasehold.ErrLeaseReleased}
	cont := leasehold.Event{Kind: leasehold.EventContention, Locker: "approval", Key: "job/1"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			obs.Observe(acq)
			obs.Observe(held)
			obs.Observe(cont)
		}
	})
}
