package prommetrics_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold"
)

// A configuration error is a store error and is counted apart as well, so
// that it can page as what it is (issue 15: fix the configuration, not the
// network); an outage is not.
func TestMisconfiguredCountedApart(t *testing.T) {
	e := newEnv(t)
	e.obs.Init("approval")
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStoreError, Locker: "approval", Op: "acquire",
		Err: errors.New("dial tcp: connection refused")})
	e.wantCounter(0, "leasehold_store_misconfigured_total", "locker", "approval")
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStoreError, Locker: "approval", Op: "acquire",
		Err: fmt.Errorf("redisstore: WRONGPASS: %w", leasehold.ErrMisconfigured)})
	e.wantCounter(1, "leasehold_store_misconfigured_total", "locker", "approval")
	e.wantCounter(2, storeErrors, "locker", "approval", "op", "acquire")
}
