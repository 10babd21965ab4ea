package drill

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// A duplicate across a failover is counted apart only while the fence
// rejected every stale write; the same history with a stale write accepted
// fails, and so do the trusted-but-not-held leases seen during the failover.
func TestCheckerFailoverCountedApartOnlyWhenFenced(t *testing.T) {
	cfg, err := Config{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// Replica 0 holds job 0 from 0 ms (fence 10); a failover begins at
	// 50 ms; replica 1 is granted job 0 on the new master at 100 ms (fence
	// 20) and writes; replica 0, still on the old master, wrote at 60 ms.
	h := History{Jobs: 1, Done: 1,
		Failovers: []Span{{Start: 50 * ms, End: 80 * ms}},
		Sections: []Section{
			{ID: 0, Replica: 0, Job: 0, Key: "k", Token: "a", Fence: 10, Start: 0, End: 300 * ms, Worked: true},
			{ID: 1, Replica: 1, Job: 0, Key: "k", Token: "b", Fence: 20, Start: 100 * ms, End: 200 * ms, Worked: true},
		},
		Acquisitions: []Acquisition{{Key: "k", Token: "a", Fence: 10, At: 0}, {Key: "k", Token: "b", Fence: 20, Replica: 1, At: 100 * ms}},
		Ops: []Op{
			w(0, 0, 0, 10, "old", true, 60*ms, 61*ms),
			w(1, 0, 1, 20, "new", true, 150*ms, 151*ms),
			w(0, 0, 0, 10, "old2", false, 250*ms, 251*ms),
		},
		FailoverBeliefs: []Anomaly{{At: 160 * ms, Key: "k", Detail: "replica 0 trusted its lease"}},
	}
	rep := Check(cfg, h)
	for _, name := range []string{"no stale write accepted", "no duplicate execution", "fences increase", "no client trusts a lock it does not hold"} {
		if v := verdict(t, rep, name); v.Verdict != Pass {
			t.Errorf("fenced: %s: expected PASS, got %s %q %v", name, v.Verdict, v.Summary, v.Details)
		}
	}
	if v := verdict(t, rep, "no duplicate execution"); !strings.Contains(v.Summary, "1 more across a failover") {
		t.Errorf("expected the duplicate counted apart, got %q", v.Summary)
	}
	fo := verdict(t, rep, "failover")
	if !strings.Contains(fo.Summary, "1 keys with two holders (longest window 100ms)") || !strings.Contains(fo.Summary, "1 stale writes rejected") ||
		!strings.Contains(fo.Summary, "new master in place after 30ms") {
		t.Errorf("expected the failover's duration, two-holder window and rejected write, got %q", fo.Summary)
	}

	// The old holder's late write accepted: a stale write, and nothing is
	// counted apart any more.
	h.Ops[2].Accepted = true
	rep = Check(cfg, h)
	for _, name := range []string{"no stale write accepted", "no duplicate execution", "no client trusts a lock it does not hold"} {
		if v := verdict(t, rep, name); v.Verdict != Fail {
			t.Errorf("unfenced: %s: expected FAIL, got %s %q", name, v.Verdict, v.Summary)
		}
	}
}

// Two trusted leaders during a failover are counted apart only when fenced.
func TestCheckTrustedDuringFailover(t *testing.T) {
	h := History{
		Failovers: []Span{{Start: 10 * ms, End: 20 * ms}},
		Sections:  []Section{{Start: 0, End: 100 * ms}, {Start: 30 * ms, End: 150 * ms}},
	}
	if v := checkTrusted(h, 1, "x", true); v.Verdict != Pass || !strings.Contains(v.Summary, "1 more during a failover") {
		t.Errorf("fenced: expected PASS with one moment counted apart, got %s %q", v.Verdict, v.Summary)
	}
	if v := checkTrusted(h, 1, "x", false); v.Verdict != Fail {
		t.Errorf("unfenced: expected FAIL, got %s %q", v.Verdict, v.Summary)
	}
	// Two leaders after the failover's settling time: a violation.
	h.Sections = []Section{{Start: 0, End: failoverSettle + time.Second}, {Start: failoverSettle + 500*ms, End: failoverSettle + 2*time.Second}}
	if v := checkTrusted(h, 1, "x", true); v.Verdict != Fail {
		t.Errorf("after the settling time: expected FAIL, got %s %q", v.Verdict, v.Summary)
	}
}

func TestFailoverNeedsSentinel(t *testing.T) {
	for _, s := range []string{"", StoreRedisServer, "redis://127.0.0.1:6379"} {
		_, err := Config{Store: s, Faults: []Fault{FaultFailover}}.WithDefaults()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), StoreRedisSentinel) {
			t.Errorf("store %q: expected ErrInvalidConfig naming %s, got %v", s, StoreRedisSentinel, err)
		}
	}
	if _, err := (Config{Store: StoreRedisSentinel, Processes: true}).WithDefaults(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("expected --processes refused on %s, got %v", StoreRedisSentinel, err)
	}
	fs, err := ParseFaults("failover,pause")
	if err != nil || len(fs) != 2 || fs[1] != FaultFailover {
		t.Errorf("expected [pause failover], got %v, %v", fs, err)
	}
}

// On a Sentinel group the drill started (real redis-server processes), a
// SENTINEL FAILOVER while replicas hold and wait keeps the safe
// configuration's verdicts, and the report times the failover.
// LEASEHOLD_DRILL_FAILOVER_RUNS=N repeats it (for docs/drill.md).
func TestRedisSentinelFailover(t *testing.T) {
	testredis.Binary(t)
	t.Parallel()
	runs := 1
	if n := os.Getenv("LEASEHOLD_DRILL_FAILOVER_RUNS"); n != "" {
		runs = atoiOr(n, 1)
	}
	for range runs {
		rep, err := Run(t.Context(), Config{Store: StoreRedisSentinel, TTL: 400 * time.Millisecond, Jobs: 30, Faults: []Fault{FaultPause, FaultFailover}})
		if err != nil {
			t.Fatal(err)
		}
		logReport(t, rep)
		if !rep.Passed {
			t.Fatalf("expected every invariant to hold across the failover, failed: %+v", rep.Failed())
		}
		if len(rep.History.Failovers) != 1 {
			t.Fatalf("expected one failover recorded, got %v (windows %+v)", rep.History.Failovers, rep.History.Windows)
		}
		f := rep.History.Failovers[0]
		if f.End <= f.Start {
			t.Errorf("expected the failover to take time, got %v–%v", f.Start, f.End)
		}
		fo := verdict(t, rep, "failover")
		if !strings.Contains(fo.Summary, "new master in place after") {
			t.Errorf("expected the failover's duration in the report, got %q", fo.Summary)
		}
		if v := verdict(t, rep, "fences increase"); !strings.Contains(v.Summary, "across a failover") {
			t.Errorf("expected fences checked across the failover, got %q", v.Summary)
		}
	}
}

func atoiOr(s string, def int) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return def
		}
		n = n*10 + int(c-'0')
	}
	if n == 0 {
		return def
	}
	return n
}
