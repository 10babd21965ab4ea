package cli

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// runbookShellLines returns the lines of docs/runbook.md's ```sh blocks.
func runbookShellLines(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(repoFile(t, filepath.Join("docs", "runbook.md")))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	inBlock := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			inBlock = true
		case strings.HasPrefix(line, "```"):
			inBlock = false
		case inBlock:
			lines = append(lines, line)
		}
	}
	return lines
}

// redisErrorRE matches an error reply as redis-cli prints it.
var redisErrorRE = regexp.MustCompile(`(?m)^(\(error\) )?(NOPERM|ERR|WRONGPASS|NOAUTH|WRONGTYPE)\b`)

// Every svc and ops command of the runbook works as written against a live
// redis-server whose users are set up as the runbook and redisstore/README.md
// say (issue 16: INFO, CONFIG GET, SLOWLOG GET and ACL LOG failed with
// NOPERM under the recommended user).
func TestRunbookRedisCommandsAsWritten(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.Client(t)
	host, port, _ := strings.Cut(srv.Addr, ":")
	const svcPass, opsPass = "svc-secret-1", "ops-secret-2"

	// The service user (scripts, not Functions), from redisstore/README.md.
	doc, err := os.ReadFile(repoFile(t, filepath.Join("redisstore", "README.md")))
	if err != nil {
		t.Fatal(err)
	}
	var m []byte
	for _, l := range regexp.MustCompile(`ACL SETUSER leasehold on >PASSWORD [^\n]+`).FindAll(doc, -1) {
		if strings.Contains(string(l), "+evalsha") {
			m = l
		}
	}
	if m == nil {
		t.Fatal("no ACL SETUSER leasehold line with +evalsha in redisstore/README.md")
	}
	var args []any
	for _, f := range strings.Fields(strings.Replace(string(m), ">PASSWORD", ">"+svcPass, 1)) {
		args = append(args, f)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatalf("service user ACL from redisstore/README.md: %v", err)
	}

	lines := runbookShellLines(t)
	var defs []string
	var svcOps []string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "redis-cli ACL SETUSER leasehold-ops"):
			cmd := strings.Replace(l, "redis-cli ", "redis-cli -h "+host+" -p "+port+" ", 1)
			cmd = strings.Replace(cmd, "OPS-PASSWORD", opsPass, 1)
			if out, err := exec.CommandContext(t.Context(), "sh", "-c", cmd).CombinedOutput(); err != nil || !strings.Contains(string(out), "OK") {
				t.Fatalf("operator user ACL from the runbook: %v\n%s", err, out)
			}
		case strings.HasPrefix(l, "svc() {"), strings.HasPrefix(l, "ops() {"):
			defs = append(defs, l)
		case strings.HasPrefix(l, "svc "), strings.HasPrefix(l, "ops "):
			svcOps = append(svcOps, l)
		}
	}
	if len(defs) != 2 || len(svcOps) < 15 {
		t.Fatalf("expected the svc and ops helpers and at least 15 commands, got %d and %d", len(defs), len(svcOps))
	}

	// A lock held through the service user, as the service would.
	svcClient := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "leasehold", Password: svcPass, ContextTimeoutEnabled: true})
	defer svcClient.Close()
	rs, err := redisstore.New(svcClient, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := leasehold.New(rs, leasehold.Options{Name: "scheduler"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(t.Context(), "scheduler:job:42")
	if err != nil {
		t.Fatalf("acquire as the service user: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()

	env := append(os.Environ(), "REDIS_HOST="+host, "REDIS_PORT="+port, "SERVICE_PASSWORD="+svcPass, "OPS_PASSWORD="+opsPass)
	run := func(line string) (string, bool, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-c", strings.Join(defs, "\n")+"\n"+line)
		cmd.Env = env
		cmd.WaitDelay = time.Second
		out, err := cmd.CombinedOutput()
		return string(out), ctx.Err() != nil, err
	}
	for _, line := range svcOps {
		out, streaming, err := run(line)
		switch {
		case redisErrorRE.MatchString(out), err != nil && !streaming:
			t.Errorf("runbook command fails as written (%v):\n  %s\n%s", err, line, out)
		case strings.Contains(out, svcPass) || strings.Contains(out, opsPass):
			t.Errorf("a password shows in the output of %s", line)
		}
		if strings.Contains(line, "GET  'leasehold:{scheduler:job:42}:lock'") && !strings.Contains(out, lease.Token()) {
			t.Errorf("%s: expected the owner token %s, got %q", line, lease.Token(), out)
		}
		if strings.Contains(line, ":fence'") && strings.TrimSpace(out) != strconv.FormatUint(lease.Fence(), 10) {
			t.Errorf("%s: expected the fence %d, got %q", line, lease.Fence(), out)
		}
	}
	// The split is needed: the service user may not read the server's
	// state, and the operator user may not write.
	if out, _, _ := run("svc INFO replication"); !strings.Contains(out, "NOPERM") {
		t.Errorf("expected NOPERM for INFO under the service user, got %q", out)
	}
	if out, _, _ := run("ops SET 'leasehold:{x}:lock' t"); !strings.Contains(out, "NOPERM") {
		t.Errorf("expected NOPERM for SET under the operator user, got %q", out)
	}
}
