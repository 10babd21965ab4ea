package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWrite writes the man pages and checks that run's page documents its
// flags.
func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "man")
	if err := write(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "leasehold-run.1"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.Contains(s, ".TH \"LEASEHOLD\"") || !strings.Contains(s, "--wait") {
		t.Errorf("leasehold-run.1 lacks the header or --wait:\n%s", s)
	}
	if _, err := os.Stat(filepath.Join(dir, "leasehold.1")); err != nil {
		t.Error(err)
	}
}
