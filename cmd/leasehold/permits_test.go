package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/internal/testredis"
)

type permitsOut struct {
	Key     string `json:"key"`
	Limit   int    `json:"limit"`
	Waiting int    `json:"waiting"`
	Holders []struct {
		Token  string `json:"token"`
		Holder string `json:"holder"`
		Fence  uint64 `json:"fence"`
	} `json:"holders"`
}

// twoHolders reports whether o is key's semaphore of 3 permits with two
// holders by fence, with tokens and identities.
func (o permitsOut) twoHolders(key string) bool {
	if o.Key != key || o.Limit != 3 || len(o.Holders) != 2 {
		return false
	}
	a, b := o.Holders[0], o.Holders[1]
	return a.Fence != 0 && a.Fence < b.Fence && a.Token != "" && b.Token != "" && a.Holder != "" && b.Holder != ""
}

// inspect (when no lock is held on the key) and permits list the permit
// holders of run --limit on every store the CLI serves across processes.
func TestInspectListsPermitHolders(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return testredis.Start(t).URL() }},
		{"etcd", func(t *testing.T) string { return etcdURL(testetcd.Start(t)) }},
		{"postgres", func(t *testing.T) string { return testpg.Start(t).DSN() }},
	} {
		t.Run(tc.name, func(t *testing.T) { checkPermitHolders(t, []string{"LEASEHOLD_STORE=" + tc.url(t)}) })
	}
}

// checkPermitHolders runs two holders of a semaphore of 3 permits and checks
// what permits and inspect show.
func checkPermitHolders(t *testing.T, env []string) {
	const key = "e2e:permits"
	var procs []*proc
	for range 2 {
		procs = append(procs, start(t, env, "run", "--key", key, "--limit", "3", "--ttl", "20s", "--", "sleep", "60"))
	}
	var info permitsOut
	waitFor(t, 20*time.Second, "two permit holders", func() bool {
		code, stdout, _ := lh(t, env, "permits", key, "--json")
		return code == 0 && json.Unmarshal([]byte(stdout), &info) == nil && len(info.Holders) == 2
	})
	code, stdout, stderr := lh(t, env, "inspect", key, "--json")
	var got permitsOut
	if err := json.Unmarshal([]byte(stdout), &got); code != 0 || err != nil {
		t.Fatalf("inspect --json of a semaphore key: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
	if !got.twoHolders(key) {
		t.Fatalf("inspect --json: expected key %s, limit 3 and two holders by fence with tokens and identities, got %+v", key, got)
	}
	code, stdout, stderr = lh(t, env, "inspect", key)
	if code != 0 || !strings.Contains(stdout, "limit") || !strings.Contains(stdout, got.Holders[0].Token) || !strings.Contains(stdout, got.Holders[1].Token) {
		t.Fatalf("inspect of a semaphore key: expected the limit and both holders' tokens, got exit %d\n%s%s", code, stdout, stderr)
	}
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		p.wait(20 * time.Second)
	}
	if code, _, _ := lh(t, env, "inspect", key); code != 1 {
		t.Fatalf("inspect after both holders ended: expected exit 1, got %d", code)
	}
}
