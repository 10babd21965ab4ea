// Command mangen writes the man pages of the leasehold command (leasehold.1,
// leasehold-run.1, …) into a directory; `make man` runs it, for packagers.
//
// It is a program of its own, not a leasehold subcommand, because
// cobra/doc brings a Markdown renderer and a YAML library whose package
// initialisation the linker keeps: 0.8 MB of the leasehold binary for a
// task done once per release.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra/doc"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mangen DIR")
		os.Exit(2)
	}
	if err := write(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "mangen: %v\n", err)
		os.Exit(1)
	}
}

// write writes one man page per command of leasehold into dir.
func write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	app := &cli.App{Stdout: io.Discard, Stderr: io.Discard, Getenv: os.Getenv}
	root := app.Root()
	root.DisableAutoGenTag = true
	return doc.GenManTree(root, &doc.GenManHeader{Title: "LEASEHOLD", Section: "1", Source: "leasehold"}, dir)
}
