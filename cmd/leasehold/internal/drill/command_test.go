package drill

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/testredis"
)

// runCommand runs the drill command quietly (no progress lines: stdout and
// stderr share one buffer here) and returns what it printed.
func runCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := Command()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--quiet"))
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func TestCommandBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--fencing", "maybe"},
		{"--on-store-error", "fail-sideways"},
		{"--on-renew-failure", "pray"},
		{"--faults", "pause,meteor"},
		{"--replicas", "1"},
		{"--ttl", "-1s"},
		{"--no-such-flag"},
		{"--store", "postgres://user:hunter2@localhost:5432/db?migrate=perhaps"},
		{"--store", "postgres://user:hunter2@localhost:5432", "--processes"},
		{"--store", "redis://user:hunter2@localhost:6379/notadb"},
		{"--workload", "lottery"},
		{"--workload", "semaphore", "--permits", "3"}, // not below --replicas
		{"--workload", "election", "--store", "redis-server", "--processes"},
	} {
		out, err := runCommand(t, args...)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%v: expected ErrInvalidConfig, got %v", args, err)
		}
		if err != nil && strings.Contains(err.Error()+out, "hunter2") {
			t.Errorf("%v: the password leaked into the output: %v", args, err)
		}
	}
}

func TestCommandJSONAndTimeline(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "drill.svg")
	out, err := runCommand(t, "--faults", "crash", "--jobs", "8", "--ttl", "150ms", "--json", "--timeline", svg)
	if err != nil {
		t.Fatalf("expected a passing drill, got %v\n%s", err, out)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("expected JSON, got %v:\n%s", err, out)
	}
	if !rep.Passed || rep.Done != 8 || len(rep.Invariants) == 0 {
		t.Errorf("expected a passed report with 8 jobs done, got passed=%v done=%d", rep.Passed, rep.Done)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("<svg")) || !bytes.Contains(b, []byte("crash")) {
		t.Errorf("expected an SVG timeline showing the crash, got %.200s", b)
	}
}

func TestCommandFailsOnViolation(t *testing.T) {
	out, err := runCommand(t, "--faults", "pause", "--fencing", "off", "--jobs", "8", "--ttl", "150ms")
	if !errors.Is(err, ErrInvariantViolated) {
		t.Fatalf("expected ErrInvariantViolated, got %v\n%s", err, out)
	}
	if !strings.Contains(out, "FAIL  no stale write accepted") {
		t.Errorf("expected a FAIL verdict line for the stale write, got:\n%s", out)
	}
}

// The command on a password-protected Redis: AUTH goes through the fault
// proxy, the run passes, and the password appears nowhere in the output.
func TestCommandRedisLostReplies(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "hunter2")
	url := "redis://:hunter2@" + srv.Addr + "/1"
	out, err := runCommand(t, "--store", url, "--faults", "lostreply", "--drop-rate", "0.5", "--jobs", "8", "--ttl", "250ms", "-v")
	if err != nil {
		t.Fatalf("expected a passing drill on Redis, got %v\n%s", err, out)
	}
	t.Log("\n" + out)
	if strings.Contains(out, "hunter2") {
		t.Fatalf("the password leaked into the output:\n%s", out)
	}
	if !strings.Contains(out, "store redis "+srv.Addr+"/1 via fault proxy") || !strings.Contains(out, "drops 50% of replies") {
		t.Errorf("expected the Redis store and the lost-reply window in the output, got:\n%s", out)
	}
}

// --processes through the command on a password-protected Redis: the
// workers (this test binary, started as "worker" by the command) get the
// password through their stdin and reach Redis through the proxy; the run
// passes and the password appears nowhere.
func TestCommandProcessesWithPassword(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "hunter2")
	url := "redis://:hunter2@" + srv.Addr + "/2"
	out, err := runCommand(t, "--store", url, "--processes", "--faults", "crash,lostreply", "--jobs", "8", "--ttl", "250ms", "-v")
	if err != nil {
		t.Fatalf("expected a passing drill with worker processes, got %v\n%s", err, out)
	}
	t.Log("\n" + out)
	if strings.Contains(out, "hunter2") {
		t.Fatalf("the password leaked into the output:\n%s", out)
	}
	if !strings.Contains(out, "3 replica processes") || !strings.Contains(out, "SIGKILLed holding job") {
		t.Errorf("expected worker processes and a SIGKILL in the output, got:\n%s", out)
	}
}

// The workload flags reach the drill: an election and a semaphore run end
// to end from the command line, and the report names the workload.
func TestCommandWorkloads(t *testing.T) {
	for _, args := range [][]string{
		{"--workload", "election", "--faults", "crash"},
		{"--workload", "semaphore", "--permits", "2", "--replicas", "3", "--faults", "pause"},
	} {
		out, err := runCommand(t, append(args, "--ttl", "150ms")...)
		if err != nil {
			t.Fatalf("%v: expected a passing drill, got %v\n%s", args, err, out)
		}
		if !strings.Contains(out, args[1]) || !strings.Contains(out, "result: every invariant held") {
			t.Errorf("%v: expected the %s workload to pass, got:\n%s", args, args[1], out)
		}
	}
}
