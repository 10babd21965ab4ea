package redisstore_test

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// TestRunbook runs the redis-cli commands of README.md's runbook against a
// held lock and checks that they show its owner, TTL and fence.
func TestRunbook(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found: run scripts/install-test-deps.sh (Debian package redis-tools)")
	}
	srv := testredis.Start(t)
	s := newStore(t, srv.Client(t), redisstore.Options{})
	const key = "scheduler:job:42"
	g, err := s.Acquire(t.Context(), driver.AcquireRequest{Key: key, Token: "owner-token", TTL: time.Minute, Holder: "host-a/4242"})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(cli, append([]string{"-p", strconv.Itoa(srv.Port)}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	k := "leasehold:{scheduler:job:42}"
	if got := run("GET", k+":lock"); got != "owner-token|host-a/4242" {
		t.Fatalf("GET :lock: expected owner-token|host-a/4242, got %q", got)
	}
	if ms, err := strconv.Atoi(run("PTTL", k+":lock")); err != nil || ms <= 0 || ms > 60000 {
		t.Fatalf("PTTL :lock: expected (0, 60000], got %d, %v", ms, err)
	}
	if got := run("GET", k+":fence"); got != strconv.FormatUint(g.Fence, 10) {
		t.Fatalf("GET :fence: expected %d, got %q", g.Fence, got)
	}
	if got := run("--scan", "--pattern", "leasehold:{scheduler:*}:lock"); got != k+":lock" {
		t.Fatalf("--scan: expected %s:lock, got %q", k, got)
	}
	info, err := s.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Facts["lock_key"] != k+":lock" || info.Facts["fence_key"] != k+":fence" || info.Facts["channel"] != k+":wake" {
		t.Fatalf("Facts: expected the runbook's key names, got %v", info.Facts)
	}
	run("DEL", k+":lock") // break glass
	if err := s.Release(t.Context(), key, "owner-token"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Release after DEL: expected ErrNotHeld, got %v", err)
	}
}

// TestRunbookEscapedKey checks the runbook's escaping of a key with braces
// and a percent sign: redis-cli finds its lock under the escaped tag.
func TestRunbookEscapedKey(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found: run scripts/install-test-deps.sh (Debian package redis-tools)")
	}
	srv := testredis.Start(t)
	s := newStore(t, srv.Client(t), redisstore.Options{})
	const odd = "}50%{x"
	if _, err := s.Acquire(t.Context(), driver.AcquireRequest{Key: odd, Token: "t2", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(cli, "-p", strconv.Itoa(srv.Port), "GET", "leasehold:{%7D50%25%7Bx}:lock").CombinedOutput()
	if got := strings.TrimSpace(string(out)); err != nil || got != "t2" {
		t.Fatalf("GET of the escaped lock key: expected t2, got %q, %v", got, err)
	}
	if got := s.LockKey(odd); got != "leasehold:{%7D50%25%7Bx}:lock" {
		t.Fatalf("LockKey(%q): expected leasehold:{%%7D50%%25%%7Bx}:lock, got %s", odd, got)
	}
}
