package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// runbookLogCommands returns the commands of docs/runbook.md's shell blocks
// that read app.log.
func runbookLogCommands(t *testing.T) []string {
	t.Helper()
	var cmds []string
	for _, line := range runbookShellLines(t) {
		if strings.Contains(line, "app.log") && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			cmds = append(cmds, line)
		}
	}
	return cmds
}

// logRecords returns the JSON records of a mixed log.
func logRecords(log string) []map[string]any {
	var recs []map[string]any
	for line := range strings.Lines(log) {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil {
			recs = append(recs, r)
		}
	}
	return recs
}

// The runbook's jq commands work as written on the JSON logs of real runs
// whose leases were abandoned (the store went away) and lost (the store
// forgot the lock). Issue 16: the CLI logged text only, and the runbook's
// grep found nothing.
func TestRunbookLogCommandsOnRealLogs(t *testing.T) {
	needTool(t, "jq")
	var log bytes.Buffer

	// Lost: the store forgets the lock while the command runs.
	srv := testredis.Start(t)
	done := make(chan string)
	go func() {
		_, _, errOut := runMain(t, "--store="+srv.URL(), "--log-format", "json", "run", "--key", "report:daily", "--name", "reports",
			"--ttl", "2s", "--renew-every", "200ms", "--grace", "100ms", "--", "sleep", "10")
		done <- errOut
	}()
	waitFor(t, func() bool {
		n, _ := srv.Client(t).Exists(t.Context(), "leasehold:{report:daily}:lock").Result()
		return n == 1
	})
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	log.WriteString(<-done)

	// Abandoned: the store goes away while the command runs.
	go func() {
		_, _, errOut := runMain(t, "--store="+srv.URL(), "--log-format", "json", "run", "--key", "invoice:7", "--name", "billing",
			"--ttl", "3s", "--renew-every", "200ms", "--renew-timeout", "100ms", "--max-renew-failures", "2", "--grace", "100ms", "--", "sleep", "10")
		done <- errOut
	}()
	// Wait for this run's own lock entry: the first run left other keys
	// (the fence counter) behind, so a non-empty database proves nothing.
	waitFor(t, func() bool {
		n, _ := srv.Client(t).Exists(t.Context(), "leasehold:{invoice:7}:lock").Result()
		return n == 1
	})
	srv.Stop()
	log.WriteString(<-done)

	var token string
	for _, r := range logRecords(log.String()) {
		if r["msg"] == "leasehold: lease lost" {
			token, _ = r["token"].(string)
			if h, _ := r["holder"].(string); h == "" || r["key"] != "report:daily" || r["fence"] == nil {
				t.Errorf("the lease-lost record should name the key, holder and fence: %v", r)
			}
		}
	}
	if len(token) != 8 {
		t.Fatalf("expected a lease-lost record with an 8-character token prefix, got %q in:\n%s", token, log.String())
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.log"), log.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmds := runbookLogCommands(t)
	if len(cmds) < 3 {
		t.Fatalf("expected at least 3 runbook commands on app.log, got %q", cmds)
	}
	for _, c := range cmds {
		sh := exec.CommandContext(t.Context(), "sh", "-c", c)
		sh.Dir = dir
		sh.Env = append(os.Environ(), "TOKEN="+token)
		out, err := sh.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) == 0 {
			t.Errorf("runbook command found nothing in real logs (%v):\n  %s\n%s", err, c, out)
			continue
		}
		t.Logf("%s\n%s", c, out)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
