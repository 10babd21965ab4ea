package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if IsSupervisor(os.Args[1:]) { // run and elect start this binary as their supervisor
		os.Exit(SuperviseMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	app := &App{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	code := app.Execute(t.Context(), app.Root(), args)
	return code, out.String(), errb.String()
}

// In process, so goleak sees every goroutine bench starts (workers,
// lockers, the progress line) end.
func TestBenchMemoryInProcess(t *testing.T) {
	code, stdout, stderr := runMain(t, "bench", "--store", "memory", "--duration", "200ms", "--concurrency", "2", "--waiters", "2", "--json")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var b benchJSON
	if err := json.Unmarshal([]byte(stdout), &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Cycles) != 1 || b.Cycles[0].Cycles == 0 || b.Handoff.Handoffs == 0 || b.Handoff.Errors != 0 {
		t.Errorf("implausible bench: %+v", b)
	}
	if !strings.Contains(stderr, "done") {
		t.Errorf("expected dots and done on a non-terminal stderr, got %q", stderr)
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"calibrate", "--p99", "1s", "--jitter", "0s", "--guard", "0s"}, ExitOK, ""},
		{[]string{"calibrate", "--p99", "10s", "--jitter", "1s", "--guard", "1s", "--slo", "5s"}, ExitFailure, ""},
		{[]string{"inspect", "k"}, ExitUsage, "no store: pass --store URL or set LEASEHOLD_STORE"},
		{[]string{"nope"}, ExitUsage, `unknown command "nope"`},
		{[]string{"ls", "a", "b", "--store", "memory"}, ExitUsage, "at most one PREFIX"},
	}
	for _, tt := range tests {
		code, _, stderr := runMain(t, tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: expected exit %d and %q, got %d: %s", tt.args, tt.code, tt.want, code, stderr)
		}
		if strings.Contains(stderr, "leasehold: leasehold:") {
			t.Errorf("%q: doubled prefix: %s", tt.args, stderr)
		}
	}
}

func TestDrillExitStatuses(t *testing.T) {
	code, _, errOut := runMain(t, "drill", "--replicas", "x")
	if code != ExitUsage || !strings.Contains(errOut, "--replicas") {
		t.Fatalf("expected exit 2 naming --replicas, got %d: %s", code, errOut)
	}
	code, _, errOut = runMain(t, "drill", "--fencing", "maybe")
	if code != ExitUsage || !strings.Contains(errOut, "--fencing must be on or off") {
		t.Fatalf("expected exit 2 naming --fencing, got %d: %s", code, errOut)
	}
	code, _, errOut = runMain(t, "drill", "--workload", "semaphore", "--permits", "5")
	if code != ExitUsage || !strings.Contains(errOut, "permits must be between 1 and replicas - 1") {
		t.Fatalf("expected exit 2 naming the permits, got %d: %s", code, errOut)
	}
	code, _, errOut = runMain(t, "drill", "--metrics-addr", "not-an-address")
	if code != ExitUsage || !strings.Contains(errOut, "--metrics-addr") {
		t.Fatalf("expected exit 2 naming --metrics-addr, got %d: %s", code, errOut)
	}
	code, out, errOut := runMain(t, "drill", "--jobs", "6", "--faults", "none", "--ttl", "200ms", "--metrics-addr", "127.0.0.1:0")
	if code != ExitOK || !strings.Contains(out, "every invariant held") {
		t.Fatalf("expected a passing drill with exit 0, got %d: %s %s", code, out, errOut)
	}
	code, out, _ = runMain(t, "drill", "--jobs", "12", "--faults", "pause", "--fencing", "off", "--ttl", "200ms", "--seed", "7")
	if code != ExitFailure || !strings.Contains(out, "FAIL  no stale write accepted") {
		t.Fatalf("expected the unfenced drill to fail with exit 1, got %d: %s", code, out)
	}
}

// A store URL given where a positional argument goes is never echoed with
// its password.
func TestPositionalStoreURLRedacted(t *testing.T) {
	for _, args := range [][]string{
		{"inspect", "k", "redis://u:QZJsecretVK@127.0.0.1:1"},
		{"redis://u:QZJsecretVK@127.0.0.1:1"},
		{"ls", "a", "etcd://u:QZJsecretVK@127.0.0.1:1"},
	} {
		code, stdout, errOut := runMain(t, args...)
		if code != ExitUsage {
			t.Errorf("%q: expected exit %d, got %d: %s", args, ExitUsage, code, errOut)
		}
		if strings.Contains(stdout+errOut, "QZJ") || strings.Contains(stdout+errOut, "secret") {
			t.Errorf("%q: the output shows the password: %s%s", args, stdout, errOut)
		}
	}
}
