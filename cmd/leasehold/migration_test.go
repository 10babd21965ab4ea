package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// migrationRow is one row of a table of docs/cli.md's migration section:
// its first cell and its leasehold command.
type migrationRow struct {
	what, command, status string
}

// migrationTables parses the two tables of "## Migrating from flock…":
// the flags ("| to |") and the exit statuses ("| when |").
func migrationTables(t *testing.T) (flags, statuses []migrationRow) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Migrating from flock")
	if !ok {
		t.Fatal("docs/cli.md has no section \"## Migrating from flock…\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var table *[]migrationRow
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch cells[0] {
		case "to":
			table = &flags
			continue
		case "when":
			table = &statuses
			continue
		}
		if table == nil || len(cells) < 5 {
			t.Fatalf("docs/cli.md: a migration row outside a table or with too few cells: %s", line)
		}
		_, cmd, _ := strings.Cut(cells[4], "`leasehold ")
		cmd, _, ok := strings.Cut(cmd, "`")
		if !ok {
			t.Fatalf("docs/cli.md: the leasehold cell of %q has no `leasehold …` command", cells[0])
		}
		row := migrationRow{what: cells[0], command: "leasehold " + cmd}
		if len(cells) > 5 {
			row.status = cells[5]
		}
		*table = append(*table, row)
	}
	if len(flags) < 5 || len(statuses) < 5 {
		t.Fatalf("docs/cli.md: expected two migration tables of at least 5 rows, got %d and %d", len(flags), len(statuses))
	}
	return flags, statuses
}

// shellEnv is the environment for the doc's command lines: leasehold on
// PATH, the store with a key prefix of the row's own.
func shellEnv(srv *testredis.Server, row int) []string {
	return []string{
		"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"LEASEHOLD_STORE=" + srv.URL() + "?prefix=row" + strconv.Itoa(row) + ":",
		"GORACE=atexit_sleep_ms=0",
	}
}

// runLine runs a command line of the doc through sh and returns its status
// and output.
func runLine(t *testing.T, env []string, line string) (int, string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatalf("%s: %v", line, err)
	return -1, ""
}

// Every leasehold command of the migration tables in docs/cli.md works as
// the tables say: each row of flags exits 0 on a free key (a hold is ended
// with SIGTERM), each row of statuses exits with its status.
func TestMigrationTable(t *testing.T) {
	flags, statuses := migrationTables(t)
	srv := testredis.Start(t)
	row := 0
	for _, r := range flags {
		row++
		env := shellEnv(srv, row)
		if !strings.Contains(r.command, " -- ") && !strings.Contains(r.command, " -c ") {
			holdRow(t, env, r)
			continue
		}
		if code, out := runLine(t, env, r.command); code != 0 {
			t.Errorf("docs/cli.md, %q: expected `%s` to exit 0 on a free key, got %d:\n%s", r.what, r.command, code, out)
		}
	}
	for _, r := range statuses {
		row++
		env := shellEnv(srv, row)
		want, err := strconv.Atoi(r.status)
		if err != nil {
			t.Errorf("docs/cli.md, %q: the status cell %q is not a number", r.what, r.status)
			continue
		}
		var holder *proc
		if strings.Contains(r.what, "is held") || strings.Contains(r.what, "still held") {
			holder = start(t, env[1:], "run", "--key", "job", "--ttl", "10s")
			waitFor(t, 10*time.Second, "the holder of "+r.what, func() bool { return strings.Contains(holder.stdout.String(), "holding") })
		}
		if code, out := runLine(t, env, r.command); code != want {
			t.Errorf("docs/cli.md, %q: expected `%s` to exit %d, got %d:\n%s", r.what, r.command, want, code, out)
		}
		if holder != nil {
			_ = holder.cmd.Process.Signal(syscall.SIGTERM)
			holder.wait(10 * time.Second)
		}
	}
}

// holdRow runs a command line that holds the lock until SIGTERM.
func holdRow(t *testing.T, env []string, r migrationRow) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exec "+r.command)
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("%q to hold the lock", r.what), func() bool { return strings.Contains(out.String(), "holding") })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("docs/cli.md, %q: expected `%s` to exit 0 after SIGTERM, got %v:\n%s", r.what, r.command, err, out)
	}
}
