// Command leasehold runs commands under distributed leases and inspects,
// releases, calibrates and benchmarks locks. See 'leasehold help' and
// docs/cli.md.
package main

import (
	"os"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
