package pgproc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The error names every binary a directory lacks.
func TestBinInNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	for _, b := range []string{"initdb", "pg_ctl"} {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := binIn([]string{dir})
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), dir+" lacks postgres, pg_basebackup") {
		t.Errorf("expected ErrNotInstalled naming postgres and pg_basebackup, got %v", err)
	}
	if _, err := binIn(nil); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "no initdb on PATH") {
		t.Errorf("expected ErrNotInstalled saying nothing was found, got %v", err)
	}
}

// A primary, its streaming standby, the primary's crash and the standby's
// promotion, then the old primary's restart: what the drill's failover and
// restart faults do.
func TestStandbyPromoteCrashRestart(t *testing.T) {
	bin, err := Bin()
	if err != nil {
		t.Fatalf("%v: run `make test` or scripts/install-test-deps.sh", err)
	}
	ctx := t.Context()
	p, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	st, err := p.StartStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := inRecovery(t, bin, st); got != "t" {
		t.Fatalf("expected the standby in recovery, got %q", got)
	}
	if err := p.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if got := inRecovery(t, bin, st); got != "f" {
		t.Fatalf("expected the promoted standby to take writes, got %q", got)
	}
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := inRecovery(t, bin, p); got != "f" {
		t.Fatalf("expected the restarted primary up, got %q", got)
	}
	dir := p.Dir
	p.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("expected %s removed by Close, got %v", dir, err)
	}
}

// inRecovery asks s with psql whether it is a standby ("t") or takes
// writes ("f").
func inRecovery(t *testing.T, bin string, s *Server) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "psql"), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", Superuser,
		"-d", "postgres", "-XAtc", "SELECT pg_is_in_recovery()").CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v: %s\n%s", err, out, s.Log(1000))
	}
	return strings.TrimSpace(string(out))
}
