package leasehold_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeQuickstartBuilds builds the README's quickstart, the first Go
// block that declares package main, as a program of this module: the README
// cannot show code that does not compile.
func TestReadmeQuickstartBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src := quickstart(string(readme))
	if src == "" {
		t.Fatal("README.md has no ```go block with package main")
	}
	dir, err := os.MkdirTemp(".", "readmequickstart")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "vet", "./"+filepath.Base(dir))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README quickstart does not build: %v\n%s\n%s", err, out, src)
	}
}

// quickstart returns the first ```go block of md that declares package main.
func quickstart(md string) string {
	for _, block := range strings.Split(md, "```go\n")[1:] {
		code, _, _ := strings.Cut(block, "```")
		if strings.HasPrefix(code, "package main") {
			return code
		}
	}
	return ""
}
