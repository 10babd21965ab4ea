#!/usr/bin/env bash
# Fails when the library's module graph grows: it builds a throwaway program
# that imports the root package and redisstore (a Redis user), with a replace
# to this checkout, and counts the modules `go list -m all` lists (the program
# itself included). Issue 14: at most MAX_MODULES (the single go.mod of
# before listed 78).
set -euo pipefail
MAX_MODULES=${MAX_MODULES:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cat > go.mod <<MOD
module example.com/leaseuser

go 1.25.0

require github.com/leasehold/leasehold v0.0.0-00010101000000-000000000000

replace github.com/leasehold/leasehold => $root
MOD
cat > main.go <<'GO'
package main

import (
	"fmt"

	"github.com/leasehold/leasehold"
	_ "github.com/leasehold/leasehold/redisstore"
)

func main() { fmt.Println(leasehold.ErrNotAcquired) }
GO
go mod tidy >/dev/null
go build -o /dev/null .
n=$(go list -m all | wc -l)
echo "check-module-graph: a program importing leasehold + redisstore lists $n modules (limit $MAX_MODULES):"
go list -m all | sed 's/^/  /'
if [ "$n" -gt "$MAX_MODULES" ]; then
  echo "check-module-graph: FAIL: $n modules > $MAX_MODULES" >&2
  exit 1
fi
