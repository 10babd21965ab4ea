package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/faultproxy"
	"github.com/leasehold/leasehold/internal/testredis"
)

// A holder cut off from its store abandons its lease; its command ignores
// SIGTERM and --grace is far longer than the TTL, yet the command is killed
// before the lock can expire in the store: the next holder's command never
// runs beside it. first starts the holder through a proxy that is then cut,
// next the next holder.
func graceEndsWithLease(t *testing.T, first func(storeURL, script string) *proc, next func(storeURL, script string) *proc) {
	t.Helper()
	srv := testredis.Start(t)
	px, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	dir := t.TempDir()
	pgidFile, overlap, second := filepath.Join(dir, "pgid"), filepath.Join(dir, "overlap"), filepath.Join(dir, "second")
	holder := first("redis://"+px.Addr(), `trap "" TERM; echo $$ > `+pgidFile+`; sleep 60 & wait`)
	waitFor(t, 10*time.Second, "the command to start", func() bool { return strings.HasSuffix(readFile(t, pgidFile), "\n") })
	pgid, err := strconv.Atoi(strings.TrimSpace(readFile(t, pgidFile)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	if err := px.SetDown(true); err != nil {
		t.Fatal(err)
	}
	p := next(srv.URL(), `ps -e -o pgid=,stat=,pid=,args= | awk '$1 == `+strconv.Itoa(pgid)+` && $2 !~ /^Z/' > `+overlap+`; echo ran > `+second)
	if code := p.wait(30 * time.Second); code != 0 {
		t.Errorf("next holder: expected exit 0, got %d: %s", code, p.stderr)
	}
	if readFile(t, second) == "" {
		t.Fatalf("the next holder's command did not run: %s", p.stderr)
	}
	if out := readFile(t, overlap); out != "" {
		t.Errorf("the next holder ran while the cut-off holder's command was alive:\n%s\nholder's stderr: %s", out, holder.stderr)
	}
}

func TestRunGraceEndsWithLease(t *testing.T) {
	var holder *proc
	graceEndsWithLease(t, func(storeURL, script string) *proc {
		holder = start(t, []string{"LEASEHOLD_STORE=" + storeURL}, "run", "--key", "e2e:grace", "--ttl", "3s", "--grace", "60s", "--", "sh", "-c", script)
		return holder
	}, func(storeURL, script string) *proc {
		return start(t, []string{"LEASEHOLD_STORE=" + storeURL}, "run", "--key", "e2e:grace", "--wait", "20s", "--", "sh", "-c", script)
	})
	if code := holder.wait(10 * time.Second); code != 79 {
		t.Errorf("holder: expected exit 79, got %d: %s", code, holder.stderr)
	}
}

// The same for elect: leadership abandoned by a leader cut off from the
// store ends its command before the next candidate can lead.
func TestElectGraceEndsWithLease(t *testing.T) {
	var next *proc
	graceEndsWithLease(t, func(storeURL, script string) *proc {
		return start(t, []string{"LEASEHOLD_STORE=" + storeURL}, "elect", "--key", "e2e:elect-grace", "--ttl", "3s", "--grace", "60s", "--", "sh", "-c", script)
	}, func(storeURL, script string) *proc {
		next = start(t, []string{"LEASEHOLD_STORE=" + storeURL}, "elect", "--key", "e2e:elect-grace", "--ttl", "3s", "--", "sh", "-c", script)
		return next
	})
}
