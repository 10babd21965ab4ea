package drill

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
)

// groupRun runs the election or semaphore workload and logs its report.
func groupRun(t *testing.T, cfg Config) *Report {
	t.Helper()
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	return rep
}

// expectSafe checks a safe run: every invariant held, the faults bit, and
// leadership or permits changed hands.
func expectSafe(t *testing.T, rep *Report, name string) {
	t.Helper()
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold, failed: %+v", rep.Failed())
	}
	if v := verdict(t, rep, name).Verdict; v != Pass {
		t.Errorf("expected %q to pass, got %s", name, v)
	}
	for _, w := range rep.History.Windows {
		if w.Skipped {
			t.Errorf("expected every fault injected, %s was skipped: %s", w.Fault, w.Note)
		}
	}
	replicas := map[int]bool{}
	for _, s := range rep.History.Sections {
		replicas[s.Replica] = true
	}
	if len(rep.History.Sections) < 4 || len(replicas) < 2 {
		t.Errorf("expected several terms by several replicas, got %d terms by %d replicas", len(rep.History.Sections), len(replicas))
	}
	crashed := false
	for _, s := range rep.History.Stops {
		crashed = crashed || s.Fault == FaultCrash
	}
	if !crashed {
		t.Errorf("expected the crash fault to kill a holder, got stops %+v", rep.History.Stops)
	}
}

// Election on the memory store under every fault: at most one trusted
// leader at any moment, the leaders' fenced writes linearizable, and the
// paused leader's late write rejected.
func TestElectionSafeConfigurationPassesEveryFault(t *testing.T) {
	t.Parallel()
	rep := groupRun(t, Config{Workload: WorkloadElection, TTL: 300 * time.Millisecond, Faults: AllFaults, Outage: 600 * time.Millisecond})
	expectSafe(t, rep, "at most one trusted leader")
	if rejectedWrites(rep) == 0 {
		t.Errorf("expected the paused leader's stale write rejected, got none")
	}
	if len(rep.Takeovers) == 0 {
		t.Errorf("expected takeovers measured after the pause and the crash, got none")
	}
}

// The broken variant trusts leadership for 3 × TTL past its lease: after
// a pause the checker must see two trusted leaders at once.
func TestElectionBrokenTrustFails(t *testing.T) {
	t.Parallel()
	rep := groupRun(t, Config{Workload: WorkloadElection, TTL: 300 * time.Millisecond, Faults: []Fault{FaultPause}, brokenTrust: true})
	if v := verdict(t, rep, "at most one trusted leader").Verdict; v != Fail {
		t.Errorf("expected two trusted leaders at once (FAIL), got %s", v)
	}
	if rep.Passed {
		t.Error("expected the run to fail")
	}
}

// Without fencing, the paused leader's late write lands over its
// successor's: the register checks fail too.
func TestElectionWithoutFencingFails(t *testing.T) {
	t.Parallel()
	rep := groupRun(t, Config{Workload: WorkloadElection, TTL: 300 * time.Millisecond, Faults: []Fault{FaultPause}, NoFencing: true})
	if v := verdict(t, rep, "no stale write accepted").Verdict; v != Fail {
		t.Errorf("expected the paused leader's stale write accepted (FAIL), got %s", v)
	}
	if v := verdict(t, rep, "at most one trusted leader").Verdict; v != Pass {
		t.Errorf("expected leadership itself exclusive (PASS), got %s", v)
	}
}

// Semaphore on the memory store under every fault: at most N trusted
// holders, fences unique and increasing, crashed permits come back.
func TestSemaphoreSafeConfigurationPassesEveryFault(t *testing.T) {
	t.Parallel()
	rep := groupRun(t, Config{Workload: WorkloadSemaphore, Permits: 2, Replicas: 4, TTL: 300 * time.Millisecond, Faults: AllFaults, Outage: 600 * time.Millisecond})
	expectSafe(t, rep, "at most 2 trusted holders")
	if v := verdict(t, rep, "fences unique and increasing").Verdict; v != Pass {
		t.Errorf("expected fences unique and increasing, got %s", v)
	}
}

// The broken variant keeps trusting a permit past its lease: after a pause
// the checker must count more than N trusted holders.
func TestSemaphoreBrokenTrustFails(t *testing.T) {
	t.Parallel()
	rep := groupRun(t, Config{Workload: WorkloadSemaphore, Permits: 1, TTL: 300 * time.Millisecond, Faults: []Fault{FaultPause}, brokenTrust: true})
	if v := verdict(t, rep, "at most 1 trusted holders").Verdict; v != Fail {
		t.Errorf("expected two trusted holders of one permit (FAIL), got %s", v)
	}
}

// The checkers on hand-made histories: overlapping terms fail unless a
// store restart lies between; permit fences must not repeat or go back.
func TestGroupCheckers(t *testing.T) {
	ms := time.Millisecond
	secs := []Section{{Replica: 0, Start: 0, End: 100 * ms}, {Replica: 1, Start: 50 * ms, End: 200 * ms}}
	if v := checkTrusted(History{Sections: secs}, 1, "x", false).Verdict; v != Fail {
		t.Errorf("expected overlapping terms to fail, got %s", v)
	}
	if v := checkTrusted(History{Sections: secs}, 2, "x", false).Verdict; v != Pass {
		t.Errorf("expected two terms under a limit of 2 to pass, got %s", v)
	}
	if v := checkTrusted(History{Sections: secs, Restarts: []time.Duration{20 * ms}}, 1, "x", false).Verdict; v != Pass {
		t.Errorf("expected an overlap across a restart to be counted apart, got %s", v)
	}
	touching := []Section{{Start: 0, End: 100 * ms}, {Start: 100*ms - trustSlack, End: 200 * ms}}
	if v := checkTrusted(History{Sections: touching}, 1, "x", false).Verdict; v != Pass {
		t.Errorf("expected terms within the slack to pass, got %s", v)
	}
	acq := []Acquisition{{Token: "a", Fence: 5, Call: 0, At: 10 * ms}, {Token: "b", Fence: 4, Call: 20 * ms, At: 30 * ms}}
	if v := checkPermitFences(History{Acquisitions: acq}).Verdict; v != Fail {
		t.Errorf("expected a fence going back to fail, got %s", v)
	}
	acq[1].Call = 5 * ms // concurrent with the first: not ordered
	if v := checkPermitFences(History{Acquisitions: acq}).Verdict; v != Pass {
		t.Errorf("expected concurrent permits unordered, got %s", v)
	}
	acq[1].Fence = 5
	if v := checkPermitFences(History{Acquisitions: acq}).Verdict; v != Fail {
		t.Errorf("expected a repeated fence to fail, got %s", v)
	}
}

// Both workloads on Redis (the drill's own redis-server, every fault).
func TestGroupWorkloadsOnRedis(t *testing.T) {
	testredis.Binary(t)
	t.Parallel()
	for _, w := range []Workload{WorkloadElection, WorkloadSemaphore} {
		t.Run(string(w), func(t *testing.T) {
			rep := groupRun(t, Config{Store: StoreRedisServer, Workload: w, Replicas: 4, Permits: 2, TTL: 400 * time.Millisecond,
				Faults: AllFaults, Outage: 600 * time.Millisecond})
			name := "at most one trusted leader"
			if w == WorkloadSemaphore {
				name = "at most 2 trusted holders"
			}
			expectSafe(t, rep, name)
		})
	}
}

// Both workloads on the drill's own etcd member (pause, crash, restart:
// etcd's TTLs are whole seconds, so the run is kept short).
func TestGroupWorkloadsOnEtcd(t *testing.T) {
	t.Parallel()
	for _, w := range []Workload{WorkloadElection, WorkloadSemaphore} {
		t.Run(string(w), func(t *testing.T) {
			t.Parallel()
			rep := groupRun(t, Config{Store: StoreEtcdServer, Workload: w, Replicas: 3, Permits: 2, TTL: time.Second,
				Faults: []Fault{FaultPause, FaultCrash, FaultRestart}})
			name := "at most one trusted leader"
			if w == WorkloadSemaphore {
				name = "at most 2 trusted holders"
			}
			expectSafe(t, rep, name)
		})
	}
}

// The sampler sees the semaphore's live permits with their tokens (so a
// crashed holder's permit that outlives its TTL is reported), and the jobs
// and election workloads' locks.
func TestGroupLocksSeesPermits(t *testing.T) {
	for _, w := range []Workload{WorkloadSemaphore, WorkloadElection} {
		cfg, err := Config{Workload: w}.WithDefaults()
		if err != nil {
			t.Fatal(err)
		}
		d := newDrill(cfg)
		d.be = newMemBackend(d.float, cfg.TTL)
		st := d.be.observer()
		if w == WorkloadSemaphore {
			_, err = st.AcquirePermit(t.Context(), driver.PermitRequest{Key: groupKey, Token: "tok", TTL: time.Second, Limit: 2})
		} else {
			_, err = st.Acquire(t.Context(), driver.AcquireRequest{Key: groupKey, Token: "tok", TTL: time.Second})
		}
		if err != nil {
			t.Fatal(err)
		}
		locks, err := d.groupLocks(t.Context())
		if err != nil || len(locks) != 1 || locks[0].Token != "tok" {
			t.Errorf("%s: expected the one holder with its token, got %+v, %v", w, locks, err)
		}
	}
}

// Fail-open is unsafe for a semaphore: during the outage every replica gets
// a degraded permit (fence 0) that counts against no limit, and the
// checker counts more than N trusted holders.
func TestSemaphoreFailOpenFails(t *testing.T) {
	t.Parallel()
	rep := groupRun(t, Config{Workload: WorkloadSemaphore, Permits: 2, Replicas: 4, TTL: 300 * time.Millisecond,
		Faults: []Fault{FaultOutage}, OnStoreError: leasehold.FailOpen})
	if v := verdict(t, rep, "at most 2 trusted holders").Verdict; v != Fail {
		t.Errorf("expected degraded permits beyond the limit (FAIL), got %s", v)
	}
	if rep.Events["fail_open"] == 0 {
		t.Errorf("expected fail-open fallbacks during the outage, got none")
	}
}
