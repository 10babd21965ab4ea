#!/usr/bin/env bash
# Fails when the leasehold binary, built the documented way (`make build`,
# unstripped: symbol table and DWARF kept), is larger than MAX_BINARY_BYTES,
# and when the README's `go install` line or the CLI's end-to-end tests
# build with other tags than the Makefile (issue 14, item 3; README,
# "Modules", lists what the bytes are).
set -euo pipefail
MAX_BINARY_BYTES=${MAX_BINARY_BYTES:?set by the Makefile}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tags=$(make -s -C "$root" --no-print-directory print-build-tags)
fail=0
if ! grep -qF -- "go install -tags $tags " "$root/README.md"; then
  echo "check-binary-size: FAIL: README.md has no 'go install -tags $tags' line (the Makefile's BUILD_TAGS)" >&2
  fail=1
fi
if ! grep -qF -- "buildTags = \"$tags\"" "$root/cmd/leasehold/main_test.go"; then
  echo "check-binary-size: FAIL: cmd/leasehold/main_test.go does not build with the Makefile's tags $tags" >&2
  fail=1
fi

make -s -C "$root" --no-print-directory build BIN="$tmp/leasehold"
size=$(stat -c %s "$tmp/leasehold")
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
echo "check-binary-size: make build (-tags $tags, unstripped) makes leasehold $size bytes ($(mb "$size")), limit $MAX_BINARY_BYTES ($(mb "$MAX_BINARY_BYTES"))"
# The section names stand in the ELF section header string table.
go tool nm "$tmp/leasehold" > "$tmp/nm"
if ! grep -q ' T main\.main$' "$tmp/nm" || ! LC_ALL=C grep -qaF .debug_info "$tmp/leasehold"; then
  echo "check-binary-size: FAIL: the binary lacks its symbol table or DWARF; the limit is for an unstripped build" >&2
  fail=1
fi
if [ "$size" -gt "$MAX_BINARY_BYTES" ]; then
  echo "check-binary-size: FAIL: $size bytes > $MAX_BINARY_BYTES; see README, \"Modules\", for what is linked and why" >&2
  fail=1
fi
exit $fail
