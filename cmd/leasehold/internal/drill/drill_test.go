package drill

import (
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"go.uber.org/goleak"
)

// TestMain doubles as the worker process of the --processes tests: the test
// binary started as `drill.test drill worker` (Config.WorkerCommand's
// default, this executable) or `drill.test worker` (what Command computes
// when it is the root) runs the hidden worker subcommand instead of the
// tests.
func TestMain(m *testing.M) {
	if args := os.Args[1:]; len(args) > 0 && (args[0] == "worker" || args[0] == "drill" && len(args) > 1 && args[1] == "worker") {
		if args[0] == "drill" {
			args = args[1:]
		}
		cmd := Command()
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func verdict(t *testing.T, rep *Report, name string) Invariant {
	t.Helper()
	iv, ok := rep.Invariant(name)
	if !ok {
		t.Fatalf("expected invariant %q in the report, got none", name)
	}
	return iv
}

// rejectedWrites counts the writes the register refused.
func rejectedWrites(rep *Report) int {
	n := 0
	for _, o := range rep.History.Ops {
		if o.Write && !o.Accepted {
			n++
		}
	}
	return n
}

func logReport(t *testing.T, rep *Report) {
	t.Helper()
	var b strings.Builder
	_ = rep.WriteText(&b, true)
	t.Log("\n" + b.String())
}

// The safe configuration (fail-closed, fence on renewal failure, fenced
// register) survives every fault with every invariant holding, and the
// faults really bit: the paused holder's write was rejected and the crashed
// holder's key was taken over.
func TestSafeConfigurationPassesEveryFault(t *testing.T) {
	t.Parallel()
	rep, err := Run(t.Context(), Config{TTL: 300 * time.Millisecond, Faults: AllFaults, Outage: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold, failed: %+v", rep.Failed())
	}
	if got := len(rep.History.Windows); got != len(AllFaults) {
		t.Fatalf("expected %d fault windows, got %d", len(AllFaults), got)
	}
	if rejectedWrites(rep) == 0 {
		t.Errorf("expected the paused holder's stale write to be rejected, got no rejected write")
	}
	if len(rep.Takeovers) == 0 {
		t.Errorf("expected takeovers measured after the pause and the crash, got none")
	}
	for _, tk := range rep.Takeovers {
		if tk.Takeover < tk.TTL-20*time.Millisecond {
			t.Errorf("expected takeover no earlier than the TTL, got %v for %s", tk.Takeover, tk.Key)
		}
	}
	if rep.Done != rep.Jobs {
		t.Errorf("expected all %d jobs done, got %d", rep.Jobs, rep.Done)
	}
}

// An unsafe configuration (fail-open, no fencing) under a pause and an
// outage makes the checker fail: the paused holder's stale write lands.
func TestUnsafeConfigurationFails(t *testing.T) {
	t.Parallel()
	var fallbacks atomic.Int32
	rep, err := Run(t.Context(), Config{
		TTL: 300 * time.Millisecond, Jobs: 24, OnStoreError: leasehold.FailOpen, NoFencing: true,
		Faults: []Fault{FaultPause, FaultOutage}, Outage: 600 * time.Millisecond,
		Observer: leasehold.ObserverFunc(func(e leasehold.Event) {
			if e.Kind == leasehold.EventFailOpen {
				fallbacks.Add(1)
			}
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if rep.Passed {
		t.Fatal("expected the unsafe configuration to fail an invariant, every invariant passed")
	}
	if v := verdict(t, rep, "no stale write accepted").Verdict; v != Fail {
		t.Errorf("expected a stale write accepted (FAIL), got %s", v)
	}
	if v := verdict(t, rep, "no duplicate execution").Verdict; v != Fail {
		t.Errorf("expected duplicate executions (FAIL), got %s", v)
	}
	if rep.Events["fail_open"] == 0 {
		t.Errorf("expected fail-open fallbacks during the outage, got none")
	}
	if got, want := int(fallbacks.Load()), rep.Events["fail_open"]; got != want {
		t.Errorf("expected Config.Observer to see every fail-open fallback (%d), got %d", want, got)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{Replicas: 1},
		{TTL: -time.Second},
		{Jobs: 3, Faults: AllFaults},
		{WorkMin: time.Second, WorkMax: time.Millisecond},
		{DropRate: 2},
		{Faults: []Fault{"meteor"}},
	} {
		if _, err := c.WithDefaults(); err == nil || !strings.Contains(err.Error(), "drill: invalid configuration") {
			t.Errorf("expected ErrInvalidConfig for %+v, got %v", c, err)
		}
	}
	if _, err := ParseFaults("pause,meteor"); err == nil {
		t.Error("expected an error for an unknown fault, got nil")
	}
	fs, err := ParseFaults("restart, pause")
	if err != nil || len(fs) != 2 || fs[0] != FaultPause || fs[1] != FaultRestart {
		t.Errorf("expected [pause restart], got %v, %v", fs, err)
	}
}

func TestMain_noStrayFiles(t *testing.T) {
	if _, err := os.Stat("drill.svg"); err == nil {
		t.Fatal("a test left drill.svg in the package directory")
	}
}
