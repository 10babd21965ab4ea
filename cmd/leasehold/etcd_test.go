package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
)

func etcdURL(c *testetcd.Cluster) string {
	var eps []string
	for _, ep := range c.Endpoints() {
		eps = append(eps, strings.TrimPrefix(ep, "http://"))
	}
	return "etcd://" + strings.Join(eps, ",")
}

// run, inspect and a waiting run against a real etcd member.
func TestRunEtcd(t *testing.T) {
	c := testetcd.Start(t)
	env := []string{"LEASEHOLD_STORE=" + etcdURL(c)}
	log := filepath.Join(t.TempDir(), "log")
	holder := start(t, env, "run", "--key", "e2e:etcd", "--ttl", "3s", "--",
		"sh", "-c", `echo "A $LEASEHOLD_TOKEN $LEASEHOLD_FENCE" >> `+log+`; sleep 1`)
	waitFor(t, 10*time.Second, "the holder", func() bool { return strings.Contains(readFile(t, log), "A ") })
	code, stdout, stderr := lh(t, env, "inspect", "e2e:etcd", "--json")
	var li lockOut
	if err := json.Unmarshal([]byte(stdout), &li); err != nil || code != 0 {
		t.Fatalf("inspect: %d %v %s", code, err, stderr)
	}
	a := strings.Fields(readFile(t, log))
	if li.Token != a[1] || a[2] == "0" {
		t.Errorf("inspect: expected token %s, got %+v", a[1], li)
	}
	waiter := start(t, env, "run", "--key", "e2e:etcd", "--wait", "10s", "--",
		"sh", "-c", `echo "B $LEASEHOLD_TOKEN $LEASEHOLD_FENCE" >> `+log)
	for _, p := range []*proc{holder, waiter} {
		if code := p.wait(15 * time.Second); code != 0 {
			t.Errorf("expected 0, got %d: %s", code, p.stderr)
		}
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, log)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "B ") {
		t.Fatalf("expected A then B, got %q", lines)
	}
	var fa, fb uint64
	_, _ = fmt.Sscanf(strings.Fields(lines[0])[2], "%d", &fa)
	_, _ = fmt.Sscanf(strings.Fields(lines[1])[2], "%d", &fb)
	if fa == 0 || fb <= fa {
		t.Errorf("expected increasing fences, got %d then %d", fa, fb)
	}
}

// An etcd that does not answer at open: fail-closed exits 69, fail-open runs
// the command degraded.
func TestRunEtcdUnavailable(t *testing.T) {
	env := []string{"LEASEHOLD_STORE=etcd://user:Etcd5ecretPw@127.0.0.1:1"}
	t.Run("fail-closed", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := lh(t, env, "run", "--key", "k", "--", "echo", "ran")
		if code != 69 || strings.Contains(stdout, "ran") || !strings.Contains(stderr, "unavailable") {
			t.Errorf("expected 69 and no run, got %d %q %s", code, stdout, stderr)
		}
		if strings.Contains(stdout+stderr, "Etcd5ecretPw") {
			t.Errorf("password leaked: %s", stderr)
		}
	})
	t.Run("fail-open", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := lh(t, env, "run", "--key", "k", "--on-store-error", "fail-open", "--", "sh", "-c", "echo degraded=$LEASEHOLD_DEGRADED")
		if code != 0 || !strings.Contains(stdout, "degraded=1") {
			t.Errorf("expected a degraded run, got %d %q %s", code, stdout, stderr)
		}
		if strings.Contains(stdout+stderr, "Etcd5ecretPw") {
			t.Errorf("password leaked: %s", stderr)
		}
	})
}
