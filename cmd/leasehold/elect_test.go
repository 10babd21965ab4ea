package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// terms reads the "lead FENCE PID" lines the elected commands wrote.
func terms(t *testing.T, log string) (fences []uint64, pids []int) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, log)), "\n") {
		var f uint64
		var pid int
		if _, err := fmt.Sscanf(line, "lead %d %d", &f, &pid); err == nil {
			fences, pids = append(fences, f), append(pids, pid)
		}
	}
	return fences, pids
}

// Three `elect` processes on one key: the first leads; SIGTERM makes it
// resign and the second takes over at once; SIGKILL of the second (a crash:
// its lock stays until the TTL) lets the third take over after the TTL.
// `leader` reports each leader and `leader --watch` sees every one, in order.
func TestElectAndLeader(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	key := "e2e:elect"
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "lead $LEASEHOLD_FENCE $$" >> ` + log + `; exec sleep 30`
	elect := func() *proc {
		return start(t, env, "elect", "--key", key, "--ttl", "1s", "--grace", "2s", "--", "sh", "-c", script)
	}
	t.Cleanup(func() { // should a test fail half-way
		_, pids := terms(t, log)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	watcher := start(t, env, "leader", key, "--watch", "--json")
	p1 := elect()
	waitFor(t, 10*time.Second, "the first leader", func() bool { f, _ := terms(t, log); return len(f) == 1 })
	p2 := elect()
	p3 := elect()
	time.Sleep(300 * time.Millisecond) // both queued behind the leader

	code, out, _ := lh(t, env, "leader", key, "--json")
	var ld struct {
		Leader bool   `json:"leader"`
		Holder string `json:"holder"`
		Fence  uint64 `json:"fence"`
	}
	if err := json.Unmarshal([]byte(out), &ld); code != 0 || err != nil || !ld.Leader || ld.Holder == "" {
		t.Fatalf("leader --json: expected exit 0 and a leader with a holder, got %d %v %q", code, err, out)
	}
	if f, _ := terms(t, log); ld.Fence != f[0] {
		t.Errorf("expected leader's fence %d (the command's LEASEHOLD_FENCE), got %d", f[0], ld.Fence)
	}

	// Resign: SIGTERM stops the command and hands over at once.
	_ = p1.cmd.Process.Signal(syscall.SIGTERM)
	resigned := time.Now()
	p1.wait(10 * time.Second)
	waitFor(t, 5*time.Second, "a leader after the resignation", func() bool { f, _ := terms(t, log); return len(f) == 2 })
	t.Logf("takeover after a resignation (process to process, incl. starting sh): %v", time.Since(resigned))

	// Crash: SIGKILL the leader's elect; the next one leads after the TTL.
	_, pids := terms(t, log)
	leaderPID := pids[1]
	var killed, next *proc
	for _, p := range []*proc{p2, p3} {
		if isAncestor(p.cmd.Process.Pid, leaderPID) {
			killed = p
		} else {
			next = p
		}
	}
	if killed == nil {
		t.Fatalf("no elect process is an ancestor of the leading command %d", leaderPID)
	}
	_ = killed.cmd.Process.Kill() // its supervisor kills the command
	waitFor(t, 10*time.Second, "a leader after the crash", func() bool { f, _ := terms(t, log); return len(f) == 3 })
	// Nothing notifies the watcher of a takeover after a crash: it polls
	// while the key is vacant, with a growing interval (see Observe), so
	// this term must last until it looked.
	waitFor(t, 10*time.Second, "leader --watch to see the third leader", func() bool { return len(watched(t, watcher)) == 3 })
	_ = next.cmd.Process.Signal(syscall.SIGTERM)
	next.wait(10 * time.Second)

	fences, _ := terms(t, log)
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Errorf("expected fences to rise with each leader, got %v", fences)
		}
	}
	time.Sleep(200 * time.Millisecond)
	_ = watcher.cmd.Process.Signal(syscall.SIGINT)
	watcher.wait(10 * time.Second)
	if seen := watched(t, watcher); fmt.Sprint(seen) != fmt.Sprint(fences) {
		t.Errorf("expected leader --watch to see every leader %v in order, got %v", fences, seen)
	}
	if code, _, _ := lh(t, env, "leader", key); code != 1 {
		t.Errorf("expected exit 1 from leader with nobody leading, got %d", code)
	}
}

// isAncestor reports whether anc is pid's parent or grandparent (from
// /proc): elect's command is the child of its supervisor.
func isAncestor(anc, pid int) bool {
	for range 2 {
		pid = parentOf(pid)
		if pid == anc {
			return true
		}
	}
	return false
}

// watched returns the fences of the leaders that `leader --watch --json`
// printed so far (complete lines only).
func watched(t *testing.T, watcher *proc) []uint64 {
	t.Helper()
	out := watcher.stdout.String()
	out = out[:strings.LastIndexByte(out, '\n')+1]
	var seen []uint64
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var w struct {
			Leader bool   `json:"leader"`
			Fence  uint64 `json:"fence"`
		}
		if err := dec.Decode(&w); err != nil {
			t.Fatalf("leader --watch --json: %v in %q", err, out)
		}
		if w.Leader {
			seen = append(seen, w.Fence)
		}
	}
	return seen
}
