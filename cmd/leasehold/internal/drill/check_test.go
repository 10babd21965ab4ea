package drill

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasehold/leasehold/fencetest"
)

const ms = time.Millisecond

func w(client, job, sec int, fence uint64, value string, accepted bool, call, ret time.Duration) Op {
	return Op{Client: client, Job: job, Section: sec, Write: true, Fence: fence, Value: value, Accepted: accepted, Call: call, Return: ret}
}

func rd(client, job int, fence uint64, value string, found bool, call, ret time.Duration) Op {
	return Op{Client: client, Job: job, Fence: fence, Value: value, Found: found, Call: call, Return: ret}
}

func TestCheckerFindsStaleWrite(t *testing.T) {
	cfg, err := Config{NoFencing: true}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// Replica 1 (fence 20) writes job 0; replica 0 wakes from a pause and
	// its fence-10 write is accepted afterwards: a stale write.
	h := History{Jobs: 1, Done: 1, Ops: []Op{
		rd(1, 0, 0, "", false, 0, 1*ms),
		w(1, 0, 1, 20, "new", true, 2*ms, 3*ms),
		w(0, 0, 0, 10, "old", true, 5*ms, 6*ms),
		rd(1, 0, 10, "old", true, 7*ms, 8*ms),
	}}
	rep := Check(cfg, h)
	if v := verdict(t, rep, "no stale write accepted"); v.Verdict != Fail || len(v.Details) != 1 {
		t.Errorf("expected FAIL with one stale write, got %s %q %v", v.Verdict, v.Summary, v.Details)
	}
	if v := verdict(t, rep, "no duplicate execution"); v.Verdict != Fail {
		t.Errorf("expected FAIL for two accepted leases on job 0, got %s %q", v.Verdict, v.Summary)
	}
	if v := verdict(t, rep, "register history linearizable"); v.Verdict != Pass {
		t.Errorf("expected the unfenced history to be linearizable, got %s %q", v.Verdict, v.Summary)
	}
	if rep.Passed {
		t.Error("expected the report to fail")
	}

	// The same interleaving with the stale write rejected passes.
	h.Ops[2].Accepted = false
	h.Ops[3] = rd(1, 0, 20, "new", true, 7*ms, 8*ms)
	cfg.NoFencing = false
	rep = Check(cfg, h)
	for _, name := range []string{"no stale write accepted", "no duplicate execution", "register history linearizable"} {
		if v := verdict(t, rep, name); v.Verdict != Pass {
			t.Errorf("%s: expected PASS, got %s %q %v", name, v.Verdict, v.Summary, v.Details)
		}
	}
}

// Concurrent writes are not ordered by the stale check: only a write that
// returned before another was called is.
func TestCheckerConcurrentWritesNotStale(t *testing.T) {
	cfg, _ := Config{}.WithDefaults()
	h := History{Jobs: 1, Done: 1, Ops: []Op{
		w(0, 0, 0, 20, "a", true, 0, 10*ms),
		w(1, 0, 1, 10, "b", true, 1*ms, 5*ms), // linearized before fence 20
	}}
	if v := verdict(t, Check(cfg, h), "no stale write accepted"); v.Verdict != Pass {
		t.Errorf("expected PASS for overlapping writes, got %s %q", v.Verdict, v.Summary)
	}
}

func TestPorcupineRejectsNonLinearizable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fenced bool
		ops    []Op
		want   porcupine.CheckResult
	}{
		{"read of a value never written", true, []Op{
			w(0, 0, 0, 5, "a", true, 0, 1*ms),
			rd(1, 0, 7, "b", true, 2*ms, 3*ms),
		}, porcupine.Illegal},
		{"read of an overwritten value after the overwrite returned", true, []Op{
			w(0, 0, 0, 5, "a", true, 0, 1*ms),
			w(1, 0, 1, 6, "b", true, 2*ms, 3*ms),
			rd(2, 0, 5, "a", true, 4*ms, 5*ms),
		}, porcupine.Illegal},
		{"higher fence rejected", true, []Op{
			w(0, 0, 0, 5, "a", true, 0, 1*ms),
			w(1, 0, 1, 9, "b", false, 2*ms, 3*ms),
		}, porcupine.Illegal},
		{"lower fence accepted by a fenced register", true, []Op{
			w(0, 0, 0, 5, "a", true, 0, 1*ms),
			w(1, 0, 1, 4, "b", true, 2*ms, 3*ms),
		}, porcupine.Illegal},
		{"fence 0 accepted by a fenced register", true, []Op{
			w(0, 0, 0, 0, "a", true, 0, 1*ms),
		}, porcupine.Illegal},
		{"concurrent writes in either order", true, []Op{
			w(0, 0, 0, 5, "a", true, 0, 10*ms),
			w(1, 0, 1, 4, "b", true, 1*ms, 9*ms),
			rd(2, 0, 5, "a", true, 11*ms, 12*ms),
		}, porcupine.Ok},
		{"equal fence accepted twice", true, []Op{
			w(0, 0, 0, 5, "a", true, 0, 1*ms),
			w(0, 0, 0, 5, "a2", true, 2*ms, 3*ms),
			rd(1, 0, 5, "a2", true, 4*ms, 5*ms),
		}, porcupine.Ok},
		{"unfenced register accepts a lower fence", false, []Op{
			w(0, 0, 0, 5, "a", true, 0, 1*ms),
			w(1, 0, 1, 4, "b", true, 2*ms, 3*ms),
			rd(2, 0, 4, "b", true, 4*ms, 5*ms),
		}, porcupine.Ok},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fencetest.Linearizable(registerOps(tc.ops), tc.fenced, 5*time.Second)
			if got != tc.want {
				t.Fatalf("expected %s, got %s", tc.want, got)
			}
			cfg, _ := Config{NoFencing: !tc.fenced}.WithDefaults()
			v := verdict(t, Check(cfg, History{Ops: tc.ops}), "register history linearizable").Verdict
			if want := map[porcupine.CheckResult]Verdict{porcupine.Ok: Pass, porcupine.Illegal: Fail}[tc.want]; v != want {
				t.Fatalf("expected verdict %s, got %s", want, v)
			}
		})
	}
}

func TestCheckerTakeoverAndFences(t *testing.T) {
	cfg, _ := Config{TTL: 400 * ms}.WithDefaults()
	base := History{
		Stops:   []Stop{{Fault: FaultCrash, Key: "k", Token: "A", At: 500 * ms}},
		Applied: map[string][]Call{"A": {{Call: 0, Return: 1 * ms}, {Call: 299 * ms, Return: 300 * ms}}},
	}
	// Taken over 410 ms after the last renewal: fine.
	ok := base
	ok.Acquisitions = []Acquisition{{Key: "k", Token: "A", Fence: 1, At: 0}, {Key: "k", Token: "B", Fence: 2, At: 710 * ms}}
	rep := Check(cfg, ok)
	if v := verdict(t, rep, "takeover after a silent holder"); v.Verdict != Pass || len(rep.Takeovers) != 1 || rep.Takeovers[0].Takeover != 410*ms {
		t.Errorf("expected PASS with one 410ms takeover, got %s %q %+v", v.Verdict, v.Summary, rep.Takeovers)
	}
	if v := verdict(t, rep, "fences increase"); v.Verdict != Pass {
		t.Errorf("expected fences to increase, got %s %q", v.Verdict, v.Summary)
	}
	// Taken over 210 ms after the last renewal, with a repeated fence.
	bad := base
	bad.Acquisitions = []Acquisition{{Key: "k", Token: "A", Fence: 2, At: 0}, {Key: "k", Token: "B", Fence: 2, At: 510 * ms}}
	rep = Check(cfg, bad)
	if v := verdict(t, rep, "takeover after a silent holder"); v.Verdict != Fail {
		t.Errorf("expected FAIL for a takeover before the TTL, got %s %q", v.Verdict, v.Summary)
	}
	if v := verdict(t, rep, "fences increase"); v.Verdict != Fail {
		t.Errorf("expected FAIL for a repeated fence, got %s %q", v.Verdict, v.Summary)
	}
	// A renewal that timed out through the proxy 600 ms before the takeover
	// (maybe applied, Latest after Return) is no evidence of an early one:
	// the last sure renewal was 410 ms before the TTL ran out.
	unsure := ok
	unsure.Applied = map[string][]Call{"A": {{Call: 299 * ms, Return: 300 * ms}, {Call: 400 * ms, Return: 600 * ms, Latest: 625 * ms}}}
	if v := verdict(t, Check(cfg, unsure), "takeover after a silent holder"); v.Verdict != Pass {
		t.Errorf("expected PASS when only an unanswered renewal is recent, got %s %q %v", v.Verdict, v.Summary, v.Details)
	}
}

// A duplicate whose leases straddle a store restart is expected and counted
// apart; the same duplicate without the restart fails.
func TestCheckerDuplicateAcrossRestart(t *testing.T) {
	cfg, _ := Config{}.WithDefaults()
	h := History{
		Sections: []Section{{ID: 0, Job: 0, Start: 0}, {ID: 1, Job: 0, Start: 20 * ms}},
		Ops: []Op{
			w(0, 0, 0, 10, "a", true, 30*ms, 31*ms),
			w(1, 0, 1, 20, "b", true, 40*ms, 41*ms),
		},
		Restarts: []time.Duration{10 * ms},
	}
	if v := verdict(t, Check(cfg, h), "no duplicate execution"); v.Verdict != Pass || len(v.Details) != 1 {
		t.Errorf("expected PASS with the restart duplicate listed, got %s %q %v", v.Verdict, v.Summary, v.Details)
	}
	h.Restarts = nil
	if v := verdict(t, Check(cfg, h), "no duplicate execution"); v.Verdict != Fail {
		t.Errorf("expected FAIL without a restart, got %s %q", v.Verdict, v.Summary)
	}
}
