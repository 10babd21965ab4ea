package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/internal/testpg"
)

// runbookLines returns the lines of docs/runbook.md's ```sh blocks that
// keep returns true for.
func runbookLines(t *testing.T, keep func(string) bool) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			inBlock = true
		case strings.HasPrefix(line, "```"):
			inBlock = false
		case inBlock && keep(line):
			lines = append(lines, line)
		}
	}
	return lines
}

// shell runs script with sh in its own process group, which is killed when
// limit passes (for commands that stream until Ctrl-C), and returns the
// output.
func shell(t *testing.T, limit time.Duration, env []string, script string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	return out.String()
}

// The runbook's etcd commands, as written, find a held lock's lease and its
// remaining TTL (issue 16: -w fields prints the lease ID in decimal,
// timetolive wants hex).
func TestRunbookEtcdCommandsAsWritten(t *testing.T) {
	if _, err := exec.LookPath("etcdctl"); err != nil {
		t.Fatalf("etcdctl not found (%v): run `make test`, which installs etcd-client (scripts/install-test-deps.sh)", err)
	}
	c := testetcd.Start(t)
	holder := start(t, []string{"LEASEHOLD_STORE=" + etcdURL(c)}, "run", "--key", "scheduler:job:42", "--ttl", "20s", "--", "sleep", "30")
	defer func() { _ = holder.cmd.Process.Signal(syscall.SIGTERM); holder.wait(10 * time.Second) }()

	lines := runbookLines(t, func(l string) bool {
		return strings.HasPrefix(l, "export ETCDCTL") || strings.HasPrefix(l, "etcdctl ") || strings.HasPrefix(l, "LEASE=")
	})
	if len(lines) < 4 {
		t.Fatalf("expected the etcd commands in the runbook, got %q", lines)
	}
	script := "set -e\n" + strings.Join(lines, "\n") + "\n"
	script = strings.Replace(script, "ETCDCTL_ENDPOINTS=http://127.0.0.1:2379", "ETCDCTL_ENDPOINTS="+c.Endpoint(), 1)
	var out string
	waitFor(t, 10*time.Second, "the lock in etcd", func() bool {
		out = shell(t, 10*time.Second, nil, script)
		// The whole script must have seen the lock: a run that started
		// before the holder's put found no key with `get` (Count 0), yet
		// its timetolive could already list the key on the session lease.
		return etcdLeaseHolds(out, "leasehold/scheduler:job:42") && strings.Contains(out, `"CreateRevision" : `)
	})
	for _, want := range []string{`"Lease" : `, `"CreateRevision" : `, "remaining(", "granted with TTL("} {
		if !strings.Contains(out, want) {
			t.Errorf("expected %q in the output of the runbook's etcd commands:\n%s", want, out)
		}
	}
	// The decimal ID as -w fields prints it is not what timetolive wants.
	bad := shell(t, 10*time.Second, nil, strings.Replace(script, `"$(printf '%x' "$LEASE")"`, `"$LEASE"`, 1))
	if etcdLeaseHolds(bad, "leasehold/scheduler:job:42") {
		t.Errorf("expected timetolive with the decimal lease ID to miss the lock:\n%s", bad)
	}
}

// The runbook's psql commands, as written: the table query shows a held
// lock, and the LISTEN pipeline (on the queued waiter's own channel) prints a
// hand-off to it as it happens
// (issue 16: a bare LISTEN in psql prints nothing until the next command).
func TestRunbookPsqlCommandsAsWritten(t *testing.T) {
	srv := testpg.Start(t)
	env := []string{"LEASEHOLD_STORE=" + srv.DSN()}
	pgEnv := []string{"PGURL=" + srv.DSN()}
	holder := start(t, env, "run", "--key", "scheduler:job:42", "--ttl", "20s", "--", "sleep", "3")

	lines := runbookLines(t, func(l string) bool { return strings.Contains(l, `psql "$PGURL"`) })
	if len(lines) != 2 {
		t.Fatalf("expected 2 psql commands in the runbook, got %q", lines)
	}
	query, listen := lines[0], lines[1]
	if !strings.Contains(listen, "LISTEN") {
		query, listen = listen, query
	}
	waitFor(t, 10*time.Second, "the lock row", func() bool {
		return strings.HasPrefix(shell(t, 5*time.Second, pgEnv, query), "scheduler:job:42|")
	})
	// A waiter queues behind the holder: the release hands the key to it.
	waiter := start(t, env, "run", "--key", "scheduler:job:42", "--ttl", "20s", "--wait", "20s", "--", "true")
	waitFor(t, 10*time.Second, "the waiter in the queue", func() bool {
		out := shell(t, 5*time.Second, pgEnv, `psql "$PGURL" -Atc "SELECT count(*) FROM leasehold_locks_waiters WHERE queued"`)
		return strings.TrimSpace(out) == "1"
	})

	// Watch while the holder ends (its release notifies the waiter).
	watched := make(chan string)
	go func() { watched <- shell(t, 6*time.Second, pgEnv, listen) }()
	if code := holder.wait(20 * time.Second); code != 0 {
		t.Fatalf("holder exit %d: %s", code, holder.stderr)
	}
	out := <-watched
	if !strings.Contains(out, `Asynchronous notification "leasehold.wake.`) || !strings.Contains(out, `scheduler:job:42" received`) {
		t.Errorf("expected the hand-off notification from the runbook's LISTEN pipeline, got:\n%s", out)
	}
	if code := waiter.wait(20 * time.Second); code != 0 {
		t.Fatalf("waiter exit %d: %s", code, waiter.stderr)
	}
}

// etcdLeaseHolds reports whether etcdctl lease timetolive --keys printed a
// lease with key among its attached keys.
func etcdLeaseHolds(out, key string) bool {
	for line := range strings.Lines(out) {
		if _, keys, ok := strings.Cut(line, "attached keys(["); ok && strings.Contains(keys, key) {
			return true
		}
	}
	return false
}
