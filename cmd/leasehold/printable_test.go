package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// A key, token or holder written into the store by anyone is never printed
// raw when it is not valid UTF-8: a lone byte 0x9b is CSI, the start of a
// terminal escape, for a terminal that takes 8-bit controls. ls, inspect
// and release --force print it Go-quoted, and the quoted form names it.
func TestInvalidUTF8IsQuoted(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	rs, err := redisstore.New(srv.Client(t), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const odd = "odd\x9b2J\xff"
	if _, err := rs.Acquire(t.Context(), driver.AcquireRequest{Key: odd, Token: "tok\x9b2J", TTL: time.Minute, Holder: "who\x9b2J"}); err != nil {
		t.Fatal(err)
	}
	quoted := strconv.Quote(odd)
	raw := func(what, out string) {
		t.Helper()
		if strings.Contains(out, "\x9b") || strings.Contains(out, "\xff") || strings.Contains(out, "\ufffd") {
			t.Errorf("%s printed a raw byte of invalid UTF-8:\n%q", what, out)
		}
	}
	code, out, stderr := lh(t, env, "ls", "odd")
	raw("ls", out+stderr)
	if code != 0 || !strings.Contains(out, quoted) {
		t.Errorf("ls: expected exit 0 and the key as %s, got %d:\n%q", quoted, code, out)
	}
	code, out, stderr = lh(t, env, "inspect", quoted)
	raw("inspect", out+stderr)
	if code != 0 || !strings.Contains(out, quoted) {
		t.Errorf("inspect %s: expected exit 0 and the key quoted, got %d:\n%q%q", quoted, code, out, stderr)
	}
	code, out, stderr = lh(t, env, "release", "--force", quoted)
	raw("release --force", out+stderr)
	if code != 0 {
		t.Errorf("release --force %s: expected exit 0, got %d: %q", quoted, code, stderr)
	}
}
