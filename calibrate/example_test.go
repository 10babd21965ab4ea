package calibrate_test

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/calibrate"
)

// The worked example: an 18 s p99 critical section, 4 s of jitter and a 2 s
// guard against a 30 s takeover SLO.
func ExampleCompute() {
	r, err := calibrate.Compute(calibrate.Input{
		P99: 18 * time.Second, Jitter: 4 * time.Second, Guard: 2 * time.Second,
		SLO: 30 * time.Second, MaxFailures: 2,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("ttl:", r.TTL)
	fmt.Println("renew every:", r.RenewInterval)
	fmt.Println("abandoned after:", r.BudgetTime, "headroom:", r.BudgetHeadroom)
	fmt.Println("worst takeover:", r.WorstTakeover)
	fmt.Println("verdict:", r.Verdict, "slack:", r.Slack)
	// Output:
	// ttl: 24s
	// renew every: 8s
	// abandoned after: 12.01s headroom: 10.785s
	// worst takeover: 28s
	// verdict: meets_slo slack: 2s
}
