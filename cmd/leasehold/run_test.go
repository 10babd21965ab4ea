package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

func storeEnv(srv *testredis.Server) []string {
	return []string{"LEASEHOLD_STORE=" + srv.URL()}
}

// Four runs on one key with --wait never overlap, and each sees a greater
// fence than the one before.
func TestRunConcurrentNeverOverlap(t *testing.T) {
	srv := testredis.Start(t)
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "start $LEASEHOLD_FENCE" >> ` + log + `; sleep 0.2; echo "end $LEASEHOLD_FENCE" >> ` + log
	var procs []*proc
	for range 4 {
		procs = append(procs, start(t, storeEnv(srv), "run", "--key", "e2e:concurrent", "--wait", "10s", "--ttl", "2s", "--", "sh", "-c", script))
	}
	for i, p := range procs {
		if code := p.wait(20 * time.Second); code != 0 {
			t.Errorf("run %d: expected exit 0, got %d\nstderr: %s", i, code, p.stderr)
		}
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, log)), "\n")
	if len(lines) != 8 {
		t.Fatalf("expected 8 lines, got %d:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		var s, e uint64
		if _, err := fmt.Sscanf(lines[i], "start %d", &s); err != nil {
			t.Fatalf("line %d: expected start, got %q (overlap?)", i+1, lines[i])
		}
		if _, err := fmt.Sscanf(lines[i+1], "end %d", &e); err != nil || e != s {
			t.Fatalf("line %d: expected end %d, got %q: two runs overlapped", i+2, s, lines[i+1])
		}
		if s == 0 || s <= last {
			t.Errorf("fence %d does not increase over %d", s, last)
		}
		last = s
	}
}

// A run frozen past its TTL loses the key to a waiter, but its command does
// not run beside the waiter's: the supervisor killed it when the lease's
// guard passed. When run wakes up it says the lease ended and exits 79; the
// waiter's fence exceeds the holder's.
func TestRunPausedHolderIsFenced(t *testing.T) {
	srv := testredis.Start(t)
	dir := t.TempDir()
	log, pgidFile := filepath.Join(dir, "log"), filepath.Join(dir, "pgid")
	holder := start(t, storeEnv(srv), "run", "--key", "e2e:paused", "--ttl", "1s", "--grace", "2s", "--",
		"sh", "-c", `echo $$ > `+pgidFile+`; echo "A $LEASEHOLD_FENCE" >> `+log+`; sleep 4; echo "A end" >> `+log)
	waitFor(t, 10*time.Second, "the holder's command to start", func() bool { return strings.Contains(readFile(t, log), "A ") })
	pgid := strings.TrimSpace(readFile(t, pgidFile))
	if err := holder.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waiter := start(t, storeEnv(srv), "run", "--key", "e2e:paused", "--wait", "10s", "--",
		"sh", "-c", `ps -e -o pgid=,stat=,pid=,args= | awk '$1 == `+pgid+` && $2 !~ /^Z/ { print "A alive:", $0 }' >> `+log+`; echo "B $LEASEHOLD_FENCE" >> `+log)
	if code := waiter.wait(15 * time.Second); code != 0 {
		t.Fatalf("waiter: expected exit 0, got %d\nstderr: %s", code, waiter.stderr)
	}
	if err := holder.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(10 * time.Second); code != 79 {
		t.Errorf("holder: expected exit 79, got %d\nstderr: %s", code, holder.stderr)
	}
	if !strings.Contains(holder.stderr.String(), "ended while the command ran") {
		t.Errorf("holder's stderr does not say why it stopped:\n%s", holder.stderr)
	}
	out := readFile(t, log)
	if strings.Contains(out, "A alive") {
		t.Errorf("the waiter's command ran beside the frozen holder's:\n%s", out)
	}
	var a, b uint64
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasPrefix(l, "A end"):
			t.Errorf("the fenced holder's command ran to the end:\n%s", out)
		case strings.HasPrefix(l, "A "):
			a, _ = strconv.ParseUint(strings.TrimPrefix(l, "A "), 10, 64)
		case strings.HasPrefix(l, "B "):
			b, _ = strconv.ParseUint(strings.TrimPrefix(l, "B "), 10, 64)
		}
	}
	if a == 0 || b <= a {
		t.Errorf("expected the waiter's fence to exceed the holder's, got A %d B %d", a, b)
	}
}

// Redis dies while run holds the lease: run stops the command and exits 79
// within about the TTL.
func TestRunStoreDiesWhileHolding(t *testing.T) {
	srv := testredis.Start(t)
	log := filepath.Join(t.TempDir(), "log")
	p := start(t, storeEnv(srv), "run", "--key", "e2e:dies", "--ttl", "1s", "--grace", "1s", "--",
		"sh", "-c", `echo started >> `+log+`; sleep 20; echo finished >> `+log)
	waitFor(t, 10*time.Second, "the command to start", func() bool { return strings.Contains(readFile(t, log), "started") })
	srv.Stop()
	stopped := time.Now()
	code := p.wait(15 * time.Second)
	if code != 79 {
		t.Fatalf("expected exit 79, got %d\nstderr: %s", code, p.stderr)
	}
	// TTL 1 s plus the 1 s grace at most; generous for a loaded machine.
	if took := time.Since(stopped); took > 6*time.Second {
		t.Errorf("expected run to stop within a few TTLs of the outage, took %v", took)
	}
	if strings.Contains(readFile(t, log), "finished") {
		t.Errorf("the command finished without its lease")
	}
}

func TestRunStorePolicy(t *testing.T) {
	srv := testredis.Start(t)
	srv.Stop() // nothing listens on its port now
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")

	code, _, stderr := lh(t, storeEnv(srv), "run", "--key", "e2e:policy", "--", "sh", "-c", "touch "+marker)
	if code != 69 {
		t.Errorf("fail-closed: expected exit 69, got %d\nstderr: %s", code, stderr)
	}
	if !strings.Contains(stderr, "unavailable") || !strings.Contains(stderr, "did not run") {
		t.Errorf("fail-closed: stderr does not explain:\n%s", stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("fail-closed: the command ran")
	}

	code, stdout, stderr := lh(t, storeEnv(srv), "run", "--key", "e2e:policy", "--on-store-error", "fail-open", "--",
		"sh", "-c", `echo "degraded=$LEASEHOLD_DEGRADED fence=$LEASEHOLD_FENCE"`)
	if code != 0 {
		t.Errorf("fail-open: expected exit 0, got %d\nstderr: %s", code, stderr)
	}
	if !strings.Contains(stdout, "degraded=1 fence=0") {
		t.Errorf("fail-open: expected LEASEHOLD_DEGRADED=1 and fence 0, got %q", stdout)
	}
	if !strings.Contains(stderr, "WITHOUT a lock") {
		t.Errorf("fail-open: no warning on stderr:\n%s", stderr)
	}
	noPanic(t, stdout, stderr)
}

func TestRunChildStatusAndSignals(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	if code, _, stderr := lh(t, env, "run", "--key", "e2e:status", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("expected the child's exit 3, got %d: %s", code, stderr)
	}
	if code, _, stderr := lh(t, env, "run", "--key", "e2e:status", "--", "sh", "-c", "kill -TERM $$"); code != 128+15 {
		t.Errorf("expected 143 for a child ended by SIGTERM, got %d: %s", code, stderr)
	}
	if code, _, stderr := lh(t, env, "run", "--key", "e2e:status", "--", "no-such-command-xyz"); code != 127 {
		t.Errorf("expected 127 for a missing command, got %d: %s", code, stderr)
	}
	// Flags after the key's value and env of the child.
	code, stdout, stderr := lh(t, env, "run", "--key", "e2e:status", "--ttl", "5s", "--", "sh", "-c", `echo "$LEASEHOLD_KEY ${#LEASEHOLD_TOKEN} ${LEASEHOLD_DEGRADED:-none}"`)
	if code != 0 || strings.TrimSpace(stdout) != "e2e:status 32 none" {
		t.Errorf("expected key, a 32-char token and no DEGRADED, got %d %q: %s", code, stdout, stderr)
	}

	// SIGINT to run reaches the command; its status is run's.
	log := filepath.Join(t.TempDir(), "log")
	p := start(t, env, "run", "--key", "e2e:signal", "--",
		"sh", "-c", `trap 'echo got-int >> `+log+`; exit 7' INT; echo ready >> `+log+`; sleep 10 >/dev/null 2>&1 & wait`)
	waitFor(t, 10*time.Second, "the command to start", func() bool { return strings.Contains(readFile(t, log), "ready") })
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.wait(10 * time.Second); code != 7 {
		t.Errorf("expected the trapping child's exit 7, got %d: %s", code, p.stderr)
	}
	if !strings.Contains(readFile(t, log), "got-int") {
		t.Errorf("the child did not get SIGINT")
	}
	// And the lock was released.
	if code, _, _ := lh(t, env, "inspect", "e2e:signal"); code != 1 {
		t.Errorf("expected no lock after the run, inspect exit %d", code)
	}
}

func TestRunNotAcquired(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	log := filepath.Join(t.TempDir(), "log")
	holder := start(t, env, "run", "--key", "e2e:busy", "--ttl", "5s", "--", "sh", "-c", "echo held >> "+log+"; sleep 2")
	waitFor(t, 10*time.Second, "the holder", func() bool { return strings.Contains(readFile(t, log), "held") })
	code, _, stderr := lh(t, env, "run", "--key", "e2e:busy", "--", "true")
	if code != 75 || !strings.Contains(stderr, "held by another owner") {
		t.Errorf("one try: expected 75 and a reason, got %d: %s", code, stderr)
	}
	code, _, stderr = lh(t, env, "run", "--key", "e2e:busy", "--wait", "300ms", "--", "true")
	if code != 75 || !strings.Contains(stderr, "within --wait") {
		t.Errorf("--wait: expected 75, got %d: %s", code, stderr)
	}
	if code := holder.wait(10 * time.Second); code != 0 {
		t.Errorf("holder: expected 0, got %d: %s", code, holder.stderr)
	}
}

// lockOut is the --json form of a lock.
type lockOut struct {
	Key         string            `json:"key"`
	Token       string            `json:"token"`
	Fence       uint64            `json:"fence"`
	RemainingMS *int64            `json:"remaining_ms"`
	Facts       map[string]string `json:"facts"`
}

func TestInspectLsRelease(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	dir := t.TempDir()
	holders := map[string]*proc{}
	for _, k := range []string{"jobs:1", "jobs:2"} {
		out := filepath.Join(dir, k)
		holders[k] = start(t, env, "run", "--key", k, "--ttl", "10s", "--", "sh", "-c",
			`echo "$LEASEHOLD_TOKEN $LEASEHOLD_FENCE" > `+out+`; sleep 20`)
		waitFor(t, 10*time.Second, "holder of "+k, func() bool { return strings.Contains(readFile(t, out), " ") })
	}
	tokenOf := func(k string) (string, uint64) {
		f := strings.Fields(readFile(t, filepath.Join(dir, k)))
		n, _ := strconv.ParseUint(f[1], 10, 64)
		return f[0], n
	}

	// ls --json, with the flag after the positional argument.
	code, stdout, stderr := lh(t, nil, "ls", "jobs:", "--store", srv.URL(), "--json")
	if code != 0 {
		t.Fatalf("ls: exit %d: %s", code, stderr)
	}
	var locks []lockOut
	if err := json.Unmarshal([]byte(stdout), &locks); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, stdout)
	}
	if len(locks) != 2 || locks[0].Key != "jobs:1" || locks[1].Key != "jobs:2" {
		t.Fatalf("expected jobs:1 and jobs:2, got %+v", locks)
	}
	for _, l := range locks {
		tok, fence := tokenOf(l.Key)
		if l.Token != tok || l.Fence != fence || l.RemainingMS == nil || *l.RemainingMS <= 0 || *l.RemainingMS > 10000 || l.Facts == nil {
			t.Errorf("%s: expected token %s fence %d and 0 < remaining_ms <= 10000 and facts, got %+v", l.Key, tok, fence, l)
		}
	}
	for _, field := range []string{`"key"`, `"token"`, `"fence"`, `"remaining_ms"`, `"facts"`} {
		if !strings.Contains(stdout, field) {
			t.Errorf("ls --json lacks %s", field)
		}
	}
	code, stdout, _ = lh(t, env, "ls", "nothing-here:", "--json")
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("empty ls --json: expected [] and 0, got %d %q", code, stdout)
	}
	code, stdout, _ = lh(t, env, "ls")
	if code != 0 || !strings.Contains(stdout, "KEY") || !strings.Contains(stdout, "jobs:1") || !strings.Contains(stdout, "jobs:2") {
		t.Errorf("ls table: got %d\n%s", code, stdout)
	}

	// inspect, table and JSON.
	tok1, fence1 := tokenOf("jobs:1")
	code, stdout, _ = lh(t, env, "inspect", "jobs:1")
	if code != 0 || !strings.Contains(stdout, tok1) || !strings.Contains(stdout, strconv.FormatUint(fence1, 10)) || !strings.Contains(stdout, "remaining") {
		t.Errorf("inspect table: got %d\n%s", code, stdout)
	}
	code, stdout, _ = lh(t, env, "--json", "inspect", "jobs:1")
	var one lockOut
	if err := json.Unmarshal([]byte(stdout), &one); err != nil || code != 0 || one.Token != tok1 || one.Fence != fence1 {
		t.Errorf("inspect --json: got %d %+v (%v)\n%s", code, one, err, stdout)
	}
	if code, _, stderr := lh(t, env, "inspect", "jobs:none"); code != 1 || !strings.Contains(stderr, "no lock held") {
		t.Errorf("inspect of a free key: expected 1, got %d: %s", code, stderr)
	}

	// A wrong token changes nothing.
	code, _, stderr = lh(t, env, "release", "jobs:1", "--token", "wrong")
	if code != 1 || !strings.Contains(stderr, "lock not owned") {
		t.Errorf("release --token wrong: expected 1 and 'lock not owned', got %d: %s", code, stderr)
	}
	code, stdout, _ = lh(t, env, "inspect", "jobs:1", "--json")
	if err := json.Unmarshal([]byte(stdout), &one); err != nil || code != 0 || one.Token != tok1 {
		t.Errorf("after a wrong-token release the lock must stay: got %d %+v", code, one)
	}

	// The right token releases; its holder then loses the lease and exits 79.
	if code, stdout, stderr := lh(t, env, "release", "jobs:1", "--token", tok1); code != 0 || !strings.Contains(stdout, "released jobs:1") {
		t.Errorf("release --token: expected 0, got %d: %s%s", code, stdout, stderr)
	}
	// --force says what it deleted.
	tok2, fence2 := tokenOf("jobs:2")
	code, stdout, stderr = lh(t, env, "release", "--force", "jobs:2", "--json")
	var forced struct {
		Key         string `json:"key"`
		Released    bool   `json:"released"`
		Forced      bool   `json:"forced"`
		Token       string `json:"token"`
		Fence       uint64 `json:"fence"`
		RemainingMS int64  `json:"remaining_ms"`
	}
	if err := json.Unmarshal([]byte(stdout), &forced); err != nil || code != 0 || !forced.Released || !forced.Forced || forced.Token != tok2 || forced.Fence != fence2 {
		t.Errorf("release --force --json: got %d %+v (%v): %s", code, forced, err, stderr)
	}
	if code, _, stderr := lh(t, env, "release", "jobs:2", "--force"); code != 1 || !strings.Contains(stderr, "no lock held") {
		t.Errorf("second --force: expected 1, got %d: %s", code, stderr)
	}
	// Both holders renew every ~3.3 s and learn they lost the lease.
	for k, p := range holders {
		if code := p.wait(15 * time.Second); code != 79 {
			t.Errorf("holder of %s: expected 79 after its lock was released under it, got %d: %s", k, code, p.stderr)
		}
	}
}

// --metrics-addr serves the leasehold series while the command runs.
func TestRunMetrics(t *testing.T) {
	srv := testredis.Start(t)
	addr := "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t))
	log := filepath.Join(t.TempDir(), "log")
	p := start(t, storeEnv(srv), "run", "--key", "e2e:metrics", "--name", "approval", "--metrics-addr", addr, "--",
		"sh", "-c", "echo up >> "+log+"; sleep 1")
	waitFor(t, 10*time.Second, "the command", func() bool { return strings.Contains(readFile(t, log), "up") })
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `leasehold_acquire_wait_seconds_count{command="run",locker="approval",result="acquired"} 1`) {
		t.Errorf("expected one acquired wait sample labelled locker=approval, got %d:\n%s", resp.StatusCode, grep(string(body), "leasehold_"))
	}
	if code := p.wait(10 * time.Second); code != 0 {
		t.Errorf("expected 0, got %d: %s", code, p.stderr)
	}
}

func grep(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Four runs with --limit 2 --wait on one key: never more than two run at
// once, two do run together, and every permit has its own fence. A fifth
// run without --wait while two hold exits 75.
func TestRunLimit(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "start $LEASEHOLD_FENCE" >> ` + log + `; sleep 1.5; echo "end $LEASEHOLD_FENCE" >> ` + log
	var procs []*proc
	for range 4 {
		procs = append(procs, start(t, env, "run", "--key", "e2e:limit", "--limit", "2", "--wait", "20s", "--ttl", "3s", "--", "sh", "-c", script))
	}
	waitFor(t, 10*time.Second, "two holders", func() bool { return strings.Count(readFile(t, log), "start") >= 2 })
	if code, _, stderr := lh(t, env, "run", "--key", "e2e:limit", "--limit", "2", "--", "true"); code != 75 {
		t.Errorf("a try while two permits are held: expected 75, got %d: %s", code, stderr)
	}
	code, stdout, stderr := lh(t, env, "permits", "e2e:limit", "--json")
	var info struct {
		Limit   int `json:"limit"`
		Holders []struct {
			Fence uint64 `json:"fence"`
		} `json:"holders"`
		Waiting int `json:"waiting"`
	}
	if err := json.Unmarshal([]byte(stdout), &info); code != 0 || err != nil || info.Limit != 2 || len(info.Holders) < 1 || len(info.Holders) > 2 || info.Waiting > 2 {
		t.Errorf("permits --json while two hold (and up to two wait): got exit %d %+v (%v)\n%s%s", code, info, err, stdout, stderr)
	}
	for i, p := range procs {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Errorf("run %d: expected exit 0, got %d\nstderr: %s", i, code, p.stderr)
		}
	}
	running, most := 0, 0
	fences := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, log)), "\n") {
		what, fence, _ := strings.Cut(line, " ")
		if what == "start" {
			running++
			if fences[fence] || fence == "0" {
				t.Errorf("fence %s repeated or zero", fence)
			}
			fences[fence] = true
		} else {
			running--
		}
		most = max(most, running)
	}
	if most != 2 || len(fences) != 4 {
		t.Fatalf("expected at most and at least 2 runs at once and 4 fences, got %d at once, %d fences", most, len(fences))
	}
}

// flock's conventions: -w/--wait take plain (fractional) seconds as well as
// durations, -n is --wait 0, -E sets the status of a conflict.
func TestRunFlockFlags(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	holder := start(t, env, "run", "--key", "e2e:flock", "--ttl", "10s")
	waitFor(t, 10*time.Second, "the holder", func() bool { return strings.Contains(holder.stdout.String(), "holding") })
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-w", "0.5"}, 75, "not acquired within --wait 500ms"},
		{[]string{"--wait", "1", "-E", "9"}, 9, "not acquired within --wait 1s"},
		{[]string{"--wait=300ms"}, 75, "not acquired within --wait 300ms"},
		{[]string{"-n", "-E", "3"}, 3, "use --wait to wait for it"},
		{[]string{"--nonblock", "--conflict-exit-code", "0"}, 0, "use --wait to wait for it"},
		{[]string{"-n", "-w", "5"}, 2, "-n/--nonblock means --wait 0"},
		{[]string{"-w", "soon"}, 2, `want seconds (5, 0.5) or a duration (1m30s), got "soon"`},
	} {
		args := append(append([]string{"run", "--key", "e2e:flock"}, tt.args...), "--", "true")
		code, _, stderr := lh(t, env, args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: expected exit %d and %q, got %d:\n%s", tt.args, tt.code, tt.want, code, stderr)
		}
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	if code := holder.wait(10 * time.Second); code != 0 {
		t.Errorf("holder: expected 0, got %d: %s", code, holder.stderr)
	}
}

// The metrics server closes an idle keep-alive connection (IdleTimeout), so
// idle clients cannot pile up connections for the whole run.
func TestMetricsServerClosesIdleConnections(t *testing.T) {
	srv := testredis.Start(t)
	addr := "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t))
	log := filepath.Join(t.TempDir(), "log")
	start(t, storeEnv(srv), "run", "--key", "e2e:idle", "--metrics-addr", addr, "--", "sh", "-c", "echo up >> "+log+"; sleep 60")
	waitFor(t, 10*time.Second, "the command", func() bool { return strings.Contains(readFile(t, log), "up") })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Now idle: the server must close the connection well before 30 s.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected the server to close the idle connection, got %v", err)
	}
}
