package drill

import (
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// The eviction fault on the drill's own redis-server: the locks are
// evicted under memory pressure, another replica takes the frozen holder's
// job at once, and the holder's write with its old fence is rejected; every
// invariant holds.
func TestRedisEvictionFault(t *testing.T) {
	testredis.Binary(t)
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: StoreRedisServer, TTL: 400 * time.Millisecond, Jobs: 20, Faults: []Fault{FaultEvict}})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold, failed: %+v", rep.Failed())
	}
	if len(rep.History.Windows) != 1 || rep.History.Windows[0].Skipped || !strings.Contains(rep.History.Windows[0].Note, "evicted") ||
		!strings.Contains(rep.History.Windows[0].Note, "was taken over") {
		t.Fatalf("expected the eviction injected and the job taken over, got %+v", rep.History.Windows)
	}
	if rejectedWrites(rep) == 0 {
		t.Fatal("expected the evicted holder's write rejected by the fenced register, got none")
	}
}

func TestEvictNeedsOwnRedis(t *testing.T) {
	if _, err := Run(t.Context(), Config{Store: "memory", Faults: []Fault{FaultEvict}}); err == nil || !strings.Contains(err.Error(), "redis-server") {
		t.Fatalf("expected the evict fault refused on the memory store, got %v", err)
	}
}
