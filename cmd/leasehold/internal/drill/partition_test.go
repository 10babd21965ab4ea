package drill

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/netns"
	"github.com/leasehold/leasehold/internal/testredis"
)

// The partition fault needs the drill's own redis-server or etcd, runs
// beside the pause and crash faults only, and not with worker processes.
func TestPartitionFaultConfiguration(t *testing.T) {
	for _, c := range []Config{
		{Faults: []Fault{FaultPartition}},
		{Store: StoreRedisSentinel, Faults: []Fault{FaultPartition}},
		{Store: StoreRedisServer, Faults: []Fault{FaultPartition, FaultOutage}},
		{Store: StoreRedisServer, Faults: []Fault{FaultPartition}, Processes: true},
	} {
		if _, err := c.WithDefaults(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s %v processes=%v: expected ErrInvalidConfig, got %v", c.Store, c.Faults, c.Processes, err)
		}
	}
	if err := netns.Available(); err != nil {
		_, err2 := Config{Store: StoreRedisServer, Faults: []Fault{FaultPartition}}.WithDefaults()
		if !errors.Is(err2, ErrInvalidConfig) || !strings.Contains(err2.Error(), err.Error()) {
			t.Errorf("without namespaces: expected ErrInvalidConfig saying %q, got %v", err, err2)
		}
	}
	if faults, err := ParseFaults("all"); err != nil || len(faults) != len(AllFaults) {
		t.Errorf(`"all" must not include partition: %v %v`, faults, err)
	}
}

// partitionRun runs the drill with the partition fault, or skips without
// root, `ip` or redis-server.
func partitionRun(t *testing.T, cfg Config) *Report {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	testredis.Binary(t)
	cfg.Store, cfg.Faults, cfg.TTL = StoreRedisServer, []Fault{FaultPartition}, 400*time.Millisecond
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if len(rep.History.Windows) != 1 || rep.History.Windows[0].Skipped || !strings.Contains(rep.History.Windows[0].Note, "cut off") {
		t.Fatalf("expected one partition injected, got %+v", rep.History.Windows)
	}
	return rep
}

// A holder cut off from Redis stops trusting its lease (fail-closed) and
// the redelivered job is done once: every invariant holds.
func TestPartitionSafeConfigurationPasses(t *testing.T) {
	rep := partitionRun(t, Config{})
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold across the partition, failed: %+v", rep.Failed())
	}
	if rep.Events["store_error"] == 0 {
		t.Errorf("expected store errors from the cut holder, got none")
	}
}

// Fail-open, renewal failures ignored, no fencing: the cut holder keeps
// trusting its lease while the redelivered job is granted to another
// replica, so the checker fails the run (the fault really bites). With the
// default renewal policy the cut holder abandons its lease after three
// failed renewals, and whether it had reached its write by then depends on
// where in its work the cut found it: the run failed in most runs, not all.
func TestPartitionUnsafeConfigurationFails(t *testing.T) {
	rep := partitionRun(t, Config{OnStoreError: leasehold.FailOpen, OnRenewFailure: leasehold.RenewalContinue, NoFencing: true})
	if rep.Passed {
		t.Fatalf("expected the checker to fail fail-open without fencing across a partition; note: %s", rep.History.Windows[0].Note)
	}
}

// On a 3-member etcd cluster the holder's member is cut off: the holder
// stops trusting its lease (its renewals need a quorum) and the redelivered
// job is done once; every invariant holds.
func TestPartitionEtcdSafeConfigurationPasses(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skipf("the etcd binary is missing (Debian package etcd-server): %v", err)
	}
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: StoreEtcdServer, Faults: []Fault{FaultPartition}, Jobs: 12})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if len(rep.History.Windows) != 1 || rep.History.Windows[0].Skipped || !strings.Contains(rep.History.Windows[0].Note, "cut off from the other members") {
		t.Fatalf("expected one partition injected, got %+v", rep.History.Windows)
	}
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold across the partition, failed: %+v", rep.Failed())
	}
}

// The note measures from the history: the cut holder's lease end, the next
// holder's grant and the stale writes in the window.
func TestPartitionNote(t *testing.T) {
	ms := time.Millisecond
	h := &History{
		Sections: []Section{
			{Replica: 1, Key: "k", Start: 100 * ms, End: 2000 * ms},
			{Replica: 2, Key: "k", Start: 700 * ms, End: 900 * ms},
		},
		Ops: []Op{{Write: true, Call: 1500 * ms}, {Write: true, Accepted: true, Call: 800 * ms}},
	}
	f := cutFacts{what: "replica 1 cut off", id: 1, cut: 200 * ms, healed: 1400 * ms, leaseEnd: 600 * ms, how: "abandoned"}
	want := "replica 1 cut off for 1.2s, replica 1 holding k; it stopped trusting its lease 400ms after the cut (abandoned); another replica was granted it 500ms after the cut (100ms after the cut holder stopped); 1 stale writes rejected"
	if got := partitionNote(h, f, 400*ms); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	f.leaseEnd = 0
	if got := partitionNote(h, f, 400*ms); !strings.Contains(got, "while the cut holder still trusted its lease") {
		t.Errorf("a holder trusting after the heal: got %q", got)
	}
	f.cut = 2500 * ms
	if got := partitionNote(h, f, 400*ms); !strings.Contains(got, "its lease had ended by the cut") {
		t.Errorf("no lease at the cut: got %q", got)
	}
}
