package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

func TestVersionHelpAndUnknownCommands(t *testing.T) {
	code, out, _ := lh(t, nil, "version", "--json")
	var v struct {
		Version, Go string
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || !strings.HasPrefix(v.Go, "go") || v.Version == "" {
		t.Errorf("version --json: expected exit 0 with version and go, got %d %v %q", code, err, out)
	}
	for _, args := range [][]string{{"help", "nonexistent"}, {""}, {"bogus"}} {
		if code, _, stderr := lh(t, nil, args...); code != 2 || !strings.Contains(stderr, "unknown") {
			t.Errorf("leasehold %q: expected exit 2 naming the unknown topic, got %d: %s", args, code, stderr)
		}
	}
	if code, out, _ := lh(t, nil, "completion", "bash"); code != 0 || !strings.Contains(out, "bash completion") {
		t.Errorf("completion bash: expected a bash completion script, got exit %d", code)
	}
	code, _, stderr := lh(t, []string{"LEASEHOLD_STORE=redis://127.0.0.1:1"}, "run", "--key", "k", "--ttl", "1ms", "--", "true")
	if code != 2 || !strings.Contains(stderr, "--ttl") || strings.Contains(stderr, "DriftMargin") {
		t.Errorf("run --ttl 1ms: expected exit 2 naming --ttl (not DriftMargin), got %d: %s", code, stderr)
	}
}

// runJSON decodes the one object run --json prints.
type runJSONOut struct {
	Key       string  `json:"key"`
	Outcome   string  `json:"outcome"`
	ExitCode  int     `json:"exit_code"`
	Fence     uint64  `json:"fence"`
	Holder    string  `json:"holder"`
	ChildExit *int    `json:"child_exit_code"`
	WaitedMS  float64 `json:"waited_ms"`
	HeldMS    float64 `json:"held_ms"`
	Cause     string  `json:"cause"`
}

func decodeRun(t *testing.T, out string) runJSONOut {
	t.Helper()
	var r runJSONOut
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("run --json: %v in %q", err, out)
	}
	return r
}

func TestRunJSONCommandStringAndConflictCode(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	code, out, stderr := lh(t, env, "run", "--key", "e2e:json", "--json", "-c", `test -z "$LEASEHOLD_STORE" && exit 3`)
	r := decodeRun(t, out)
	if code != 3 || r.ExitCode != 3 || r.ChildExit == nil || *r.ChildExit != 3 || r.Fence == 0 || r.Holder == "" || r.Outcome != "failed" {
		t.Errorf("run -c with LEASEHOLD_STORE stripped: expected exit 3 and a result with fence, holder and child status 3, got %d %+v\nstderr: %s", code, r, stderr)
	}
	// -c with an empty line (an unset variable: -c "$JOB") runs sh -c '' as
	// flock does; it does not hold the lock until a signal.
	p := start(t, env, "run", "--key", "e2e:json", "-c", "")
	if code := p.wait(10 * time.Second); code != 0 || strings.Contains(p.stdout.String(), "holding") {
		t.Errorf("run -c '': expected sh -c '' to run and exit 0, got %d: %s%s", code, p.stdout, p.stderr)
	}
	// Nor does -- with nothing after it (-- $JOB): that is bad usage.
	p = start(t, env, "run", "--key", "e2e:json", "--")
	if code := p.wait(10 * time.Second); code != 2 || !strings.Contains(p.stderr.String(), "no command after --") {
		t.Errorf("run --key K --: expected exit 2 and 'no command after --', got %d: %s%s", code, p.stdout, p.stderr)
	}
	if code, _, _ := lh(t, env, "run", "--key", "e2e:json", "--keep-store-env", "-c", `test -n "$LEASEHOLD_STORE"`); code != 0 {
		t.Errorf("run --keep-store-env: expected the child to see LEASEHOLD_STORE (exit 0), got %d", code)
	}

	holder := start(t, env, "run", "--key", "e2e:json", "--ttl", "5s")
	waitFor(t, 10*time.Second, "the hold mode to print the lease", func() bool { return strings.Contains(holder.stdout.String(), "holding") })
	code, out, _ = lh(t, env, "run", "--key", "e2e:json", "--json", "--conflict-exit-code", "9", "--", "true")
	if r := decodeRun(t, out); code != 9 || r.Outcome != "not_acquired" {
		t.Errorf("run on a held key with --conflict-exit-code 9: expected exit 9 and outcome not_acquired, got %d %+v", code, r)
	}
	// waited_ms says how long it waited, also when it gave up.
	code, out, _ = lh(t, env, "run", "--key", "e2e:json", "--json", "--wait", "0.5", "--", "true")
	if r := decodeRun(t, out); code != 75 || r.Outcome != "not_acquired" || r.WaitedMS < 400 {
		t.Errorf("run --wait 0.5 on a held key: expected exit 75, outcome not_acquired and waited_ms of about 500, got %d %+v", code, r)
	}
	code, _, stderr = lh(t, env, "run", "--key", "e2e:json", "--wait", "2500ms", "--", "true")
	if code != 75 || !strings.Contains(stderr, "waiting for e2e:json: held by") {
		t.Errorf("run --wait on a held key: expected exit 75 and a waiting line naming the holder, got %d: %s", code, stderr)
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	if code := holder.wait(10 * time.Second); code != 0 {
		t.Errorf("hold mode: expected exit 0 after SIGTERM, got %d: %s", code, holder.stderr)
	}
	if code, _, _ := lh(t, env, "inspect", "e2e:json"); code != 1 {
		t.Errorf("expected the hold mode to release the lock (inspect exit 1), got %d", code)
	}
}

// An operator's forced release while the command runs: run tells that
// story, not "expired".
func TestRunTellsOperatorRelease(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	p := start(t, env, "run", "--key", "e2e:story", "--ttl", "900ms", "--grace", "1s", "--", "sleep", "20")
	waitFor(t, 10*time.Second, "the lock to be held", func() bool { c, _, _ := lh(t, env, "inspect", "e2e:story"); return c == 0 })
	if code, out, stderr := lh(t, env, "release", "e2e:story", "--force"); code != 0 {
		t.Fatalf("release --force: exit %d: %s %s", code, out, stderr)
	}
	if code := p.wait(20 * time.Second); code != 79 {
		t.Fatalf("expected exit 79, got %d: %s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "released in the store by someone else") {
		t.Errorf("expected run to say an operator released the lock, got: %s", p.stderr)
	}
}
