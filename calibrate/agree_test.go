package calibrate_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/calibrate"
)

// calibrate and the Locker use one formula: for the library's defaults they
// agree on the renew timeout, the budget and whether it fits.
func TestComputeAgreesWithTheLocker(t *testing.T) {
	const s = time.Second
	for _, ttl := range []time.Duration{100 * time.Millisecond, time.Second, 3 * s, 30 * s, 24 * s, time.Hour} {
		r, err := calibrate.Compute(calibrate.Input{P99: ttl})
		if err != nil {
			t.Fatal(err)
		}
		b, err := leasehold.Options{TTL: ttl}.Budget()
		if err != nil {
			t.Fatal(err)
		}
		if r.Input.RenewTimeout != b.RenewTimeout || r.BudgetTime != b.Need() || r.BudgetOK != b.Fits() || r.DriftMargin != b.DriftMargin {
			t.Errorf("TTL %v: calibrate says timeout %v, budget %v, fits %v; the Locker %v, %v, %v",
				ttl, r.Input.RenewTimeout, r.BudgetTime, r.BudgetOK, b.RenewTimeout, b.Need(), b.Fits())
		}
		if !r.BudgetOK {
			t.Errorf("TTL %v: expected the library's defaults to fit, need %v of %v", ttl, r.BudgetTime, b.Have())
		}
	}
}
