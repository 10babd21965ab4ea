package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// procStat is what a test reads of a process's /proc/PID/stat.
type procStat struct {
	state      string
	ppid, pgrp int
}

// statOf reads pid's /proc/PID/stat; ok is false when pid is gone.
func statOf(pid int) (st procStat, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, false
	}
	// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 3 {
		return st, false
	}
	st.state = f[0]
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	return st, true
}

// livePids lists the live (not zombie) processes for which keep is true.
func livePids(t *testing.T, keep func(pid int, st procStat) bool) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := statOf(pid); ok && st.state != "Z" && keep(pid, st) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parentOf returns pid's parent, 0 when pid is gone.
func parentOf(pid int) int {
	st, _ := statOf(pid)
	return st.ppid
}

// groupMembers lists the live processes of process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	return livePids(t, func(_ int, st procStat) bool { return st.pgrp == pgid })
}

// killedWrapper SIGKILLs a leasehold process (run or elect) whose command,
// `sh -c '(sleep 3; echo done > DONE) & echo $$ > PGID; wait'`, started, and
// checks that nothing of the command survives it: no process of its group
// is left within a second (the TTL is 2 s) and DONE never appears. Then next
// takes the key: its command checks that no process of the first group is
// alive at the moment it runs.
func killedWrapper(t *testing.T, env []string, first func(script string) *proc, next func(script string)) {
	t.Helper()
	stoppedWrapper(t, env, syscall.SIGKILL, "", first, next)
}

// stoppedWrapper is killedWrapper with sig: SIGSTOP (of the leasehold
// process alone, key its lock's key) freezes it instead, so that nothing in
// it stops its command when its lease's guard passes. The command's group
// must then be gone by the time the lock expires in the store (read with
// inspect right after the SIGSTOP) and a small margin; the leasehold
// process gets SIGCONT after the next holder's command ran.
func stoppedWrapper(t *testing.T, env []string, sig syscall.Signal, key string, first func(script string) *proc, next func(script string)) {
	t.Helper()
	dir := t.TempDir()
	done, pgidFile, overlap, second := filepath.Join(dir, "done"), filepath.Join(dir, "pgid"), filepath.Join(dir, "overlap"), filepath.Join(dir, "second")
	p := first(`(sleep 3; echo done > ` + done + `) & echo $$ > ` + pgidFile + `; wait`)
	waitFor(t, 10*time.Second, "the command to start", func() bool { return strings.HasSuffix(readFile(t, pgidFile), "\n") })
	pgid, err := strconv.Atoi(strings.TrimSpace(readFile(t, pgidFile)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	if n := len(groupMembers(t, pgid)); n < 2 {
		t.Fatalf("expected the command's group to hold sh and its background subshell, got %d processes", n)
	}
	if p.group { // to its whole group, supervisor included unless it has its own
		err = syscall.Kill(-p.cmd.Process.Pid, sig)
	} else {
		err = p.cmd.Process.Signal(sig)
	}
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The lease expires 2 s after the last renewal, so at the earliest about
	// 1.3 s after the kill: the group must be gone well before. 1 s is
	// generous for a supervisor that acts within 100 ms.
	bound, margin := killed.Add(time.Second), 500*time.Millisecond
	if sig == syscall.SIGSTOP {
		code, out, stderr := lh(t, env, "inspect", key, "--json")
		var li struct {
			RemainingMS int64 `json:"remaining_ms"`
		}
		if err := json.Unmarshal([]byte(out), &li); code != 0 || err != nil {
			t.Fatalf("inspect %s: exit %d, %v\n%s%s", key, code, err, out, stderr)
		}
		bound = time.Now().Add(time.Duration(li.RemainingMS)*time.Millisecond + margin)
	}

	next(`ps -e -o pgid=,stat=,pid=,args= | awk '$1 == ` + strconv.Itoa(pgid) + ` && $2 !~ /^Z/' > ` + overlap + `; echo ran > ` + second)
	for len(groupMembers(t, pgid)) > 0 {
		if time.Now().After(bound) {
			t.Errorf("processes of the command's group still alive %v after its leasehold got %v (%v after the bound): %v", time.Since(killed).Round(time.Millisecond), sig, time.Since(bound).Round(time.Millisecond), groupMembers(t, pgid))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the command's group was gone %v after signal %d, %v before the bound (1 s after SIGKILL; the lock's expiry + %v after SIGSTOP)", time.Since(killed).Round(time.Millisecond), sig, time.Until(bound).Round(time.Millisecond), margin)
	waitFor(t, 20*time.Second, "the next holder's command", func() bool { return readFile(t, second) != "" })
	if sig == syscall.SIGSTOP {
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	} else {
		p.wait(10 * time.Second) // its stdout stays open while anything of the command lives
	}
	if out := readFile(t, overlap); out != "" {
		t.Errorf("the next holder ran while the killed holder's command was alive:\n%s", out)
	}
	// The background subshell would write at 3 s after its start.
	time.Sleep(time.Until(killed.Add(4 * time.Second)))
	if readFile(t, done) != "" {
		t.Errorf("the killed holder's command ran to its end")
	}
}

// SIGKILL of run or elect, or of its whole process group (timeout -s KILL
// and timeout -k signal their group, and so does the shell's kill -9 %job:
// a supervisor in that group would die with run before it could kill the
// command's group, so it lives in a group of its own), leaves nothing of
// the command running, grandchildren included, and the next run of the key
// (the next candidate) does not overlap it.
func TestKilledLeavesNoCommand(t *testing.T) {
	for _, c := range []struct {
		name, cmd string
		start     func(t *testing.T, env []string, args ...string) *proc
	}{
		{"run", "run", start}, {"elect", "elect", start},
		{"run-group", "run", startInGroup}, {"elect-group", "elect", startInGroup},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := testredis.Start(t)
			env := storeEnv(srv)
			args := []string{c.cmd, "--key", "e2e:killed-" + c.name, "--ttl", "2s"}
			var next *proc
			killedWrapper(t, env, func(script string) *proc {
				return c.start(t, env, append(args, "--", "sh", "-c", script)...)
			}, func(script string) {
				wait := args
				if c.cmd == "run" {
					wait = append(slices.Clip(args), "--wait", "20s")
				}
				next = start(t, env, append(slices.Clip(wait), "--", "sh", "-c", script)...)
			})
			if code := next.wait(20 * time.Second); code != 0 {
				t.Errorf("next %s: expected exit 0, got %d: %s", c.cmd, code, next.stderr)
			}
		})
	}
}

// childrenOf lists the live children of pid whose command line contains
// substr.
func childrenOf(t *testing.T, pid int, substr string) []int {
	t.Helper()
	return livePids(t, func(p int, st procStat) bool {
		if st.ppid != pid {
			return false
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		return strings.Contains(string(cmdline), substr)
	})
}

// Should the supervisor itself be killed, run kills the command's group,
// reports the supervisor's death as the command's status and does not hang.
func TestRunSupervisorKilled(t *testing.T) {
	srv := testredis.Start(t)
	dir := t.TempDir()
	done, pgidFile := filepath.Join(dir, "done"), filepath.Join(dir, "pgid")
	p := start(t, storeEnv(srv), "run", "--key", "e2e:supervisor-killed", "--ttl", "2s", "--",
		"sh", "-c", `(sleep 3; echo done > `+done+`) & echo $$ > `+pgidFile+`; wait`)
	waitFor(t, 10*time.Second, "the command to start", func() bool { return strings.HasSuffix(readFile(t, pgidFile), "\n") })
	pgid, _ := strconv.Atoi(strings.TrimSpace(readFile(t, pgidFile)))
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	sups := childrenOf(t, p.cmd.Process.Pid, "__supervise")
	if len(sups) != 1 {
		t.Fatalf("expected one supervisor child of run, got %v", sups)
	}
	if err := syscall.Kill(sups[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(10 * time.Second); code != 128+9 {
		t.Errorf("expected run to exit 137 (its supervisor was killed), got %d: %s", code, p.stderr)
	}
	waitFor(t, 2*time.Second, "the command's group to be gone", func() bool { return len(groupMembers(t, pgid)) == 0 })
	time.Sleep(3500 * time.Millisecond)
	if readFile(t, done) != "" {
		t.Errorf("the command's background job ran to its end after its supervisor was killed")
	}
}

// run stopped (SIGSTOP) while its command runs cannot stop the command when
// its lease's guard passes: the supervisor does, with SIGKILL to the whole
// group, before the lock expires in the store and the next run of the key
// starts. Thawed, run says the lease ended and exits 79.
func TestRunStoppedLeavesNoCommand(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	var first, next *proc
	stoppedWrapper(t, env, syscall.SIGSTOP, "e2e:stopped", func(script string) *proc {
		first = start(t, env, "run", "--key", "e2e:stopped", "--ttl", "2s", "--", "sh", "-c", script)
		return first
	}, func(script string) {
		next = start(t, env, "run", "--key", "e2e:stopped", "--ttl", "2s", "--wait", "20s", "--", "sh", "-c", script)
	})
	if code := next.wait(20 * time.Second); code != 0 {
		t.Errorf("next run: expected exit 0, got %d: %s", code, next.stderr)
	}
	if code := first.wait(10 * time.Second); code != 79 {
		t.Errorf("stopped run: expected exit 79 once thawed, got %d: %s", code, first.stderr)
	}
	if !strings.Contains(first.stderr.String(), "local guard passed and leasehold") {
		t.Errorf("the supervisor does not say why it killed the command:\n%s", first.stderr)
	}
}

// The same for elect: the stopped leader's command is killed by its
// supervisor before another candidate leads; thawed, elect campaigns again.
func TestElectStoppedLeavesNoCommand(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	var first, next *proc
	stoppedWrapper(t, env, syscall.SIGSTOP, "e2e:elect-stopped", func(script string) *proc {
		first = start(t, env, "elect", "--key", "e2e:elect-stopped", "--ttl", "2s", "--", "sh", "-c", script)
		return first
	}, func(script string) {
		next = start(t, env, "elect", "--key", "e2e:elect-stopped", "--ttl", "2s", "--", "sh", "-c", script)
	})
	if code := next.wait(20 * time.Second); code != 0 {
		t.Errorf("next elect: expected exit 0, got %d: %s", code, next.stderr)
	}
	waitFor(t, 10*time.Second, "the thawed elect to campaign again", func() bool {
		return strings.Contains(first.stderr.String(), "campaigning again")
	})
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	first.wait(10 * time.Second)
}
