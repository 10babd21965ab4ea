package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

const usageHint = "for usage."

// sayOnce checks that a message has one "leasehold:" prefix and none of the
// library's wrappers that repeat what the message already says.
func sayOnce(t *testing.T, what, stderr string) {
	t.Helper()
	if n := strings.Count(stderr, "leasehold:"); n != 1 {
		t.Errorf("%s: expected one \"leasehold:\", got %d:\n%s", what, n, stderr)
	}
	for _, rep := range []string{"store failure during", "redisstore:", "store misconfigured", usageHint, ".;"} {
		if strings.Contains(stderr, rep) {
			t.Errorf("%s: expected no %q, got:\n%s", what, rep, stderr)
		}
	}
}

// A refused password: the store's words, the key once, what to do, and no
// usage hint (the command line was right).
func TestErrorStoreRefused(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "right")
	env := []string{"LEASEHOLD_STORE=redis://:wrong@" + srv.Addr}
	code, _, stderr := lh(t, env, "run", "--key", "job:7", "--", "true")
	if code != 77 || !strings.Contains(stderr, "WRONGPASS") || !strings.Contains(stderr, "fix the URL's user and password") || strings.Count(stderr, `"job:7"`) != 1 {
		t.Errorf("run: expected exit 77 with WRONGPASS, the key once and what to fix, got %d:\n%s", code, stderr)
	}
	sayOnce(t, "run", stderr)
	code, _, stderr = lh(t, env, "inspect", "job:7")
	if code == 0 || !strings.Contains(stderr, "WRONGPASS") {
		t.Errorf("inspect: expected a failure with WRONGPASS, got %d:\n%s", code, stderr)
	}
	sayOnce(t, "inspect", stderr)
}

// fakeServer listens on loopback and answers every connection with reply
// (nothing: it closes at once).
func fakeServer(t *testing.T, reply string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if reply != "" {
				_ = c.SetDeadline(time.Now().Add(time.Second))
				_, _ = c.Read(make([]byte, 512))
				_, _ = c.Write([]byte(reply))
			}
			_ = c.Close()
		}
	})
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l.Addr().String()
}

// A redis:// URL pointed at a server that does not speak Redis names the
// likely cause.
func TestErrorNotRedis(t *testing.T) {
	for name, reply := range map[string]string{
		"closes":         "",
		"answers HTTP":   "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
		"answers binary": "\x00\x00\x12\x04\x00\x00\x00\x00\x00",
	} {
		t.Run(name, func(t *testing.T) {
			env := []string{"LEASEHOLD_STORE=redis://" + fakeServer(t, reply) + "?max_retries=0"}
			for _, args := range [][]string{{"run", "--key", "k", "--", "true"}, {"inspect", "k"}} {
				code, _, stderr := lh(t, env, args...)
				if code == 0 || !strings.Contains(stderr, "is this a Redis server?") {
					t.Errorf("%s: expected a failure asking whether this is a Redis server, got %d:\n%s", args[0], code, stderr)
				}
				sayOnce(t, args[0], stderr)
			}
		})
	}
}

// Mistyped commands get cobra's suggestions; errors about usage keep the
// usage hint.
func TestErrorSuggestionsAndUsageHint(t *testing.T) {
	for typo, want := range map[string]string{"relase": "did you mean release?", "elec": "did you mean elect?", "inpsect": "did you mean inspect?"} {
		code, _, stderr := lh(t, nil, typo, "k")
		if code != 2 || !strings.Contains(stderr, want) || !strings.Contains(stderr, usageHint) {
			t.Errorf("%s: expected exit 2, %q and the usage hint, got %d:\n%s", typo, want, code, stderr)
		}
	}
	code, _, stderr := lh(t, nil, "help", "relase")
	if code != 2 || !strings.Contains(stderr, "did you mean release?") || strings.Contains(stderr, usageHint) {
		t.Errorf("help relase: expected exit 2 and a suggestion without a usage hint, got %d:\n%s", code, stderr)
	}
	code, _, stderr = lh(t, nil, "")
	if code != 2 || strings.Contains(stderr, "did you mean") {
		t.Errorf("an empty command: expected exit 2 and no suggestion, got %d:\n%s", code, stderr)
	}
	code, _, stderr = lh(t, nil, "run", "--bogus")
	if code != 2 || !strings.Contains(stderr, "Run 'leasehold run --help' for usage.") {
		t.Errorf("unknown flag: expected exit 2 and the usage hint, got %d:\n%s", code, stderr)
	}
}

// A full semaphore says how many permits are held; permits prints no empty
// fields.
func TestErrorSemaphoreWording(t *testing.T) {
	srv := testredis.Start(t)
	env := storeEnv(srv)
	var holders []*proc
	for range 2 {
		p := start(t, env, "run", "--key", "e2e:sem", "--limit", "2", "--ttl", "10s")
		waitFor(t, 10*time.Second, "a permit holder", func() bool { return strings.Contains(p.stdout.String(), "holding") })
		holders = append(holders, p)
	}
	code, _, stderr := lh(t, env, "run", "--key", "e2e:sem", "--limit", "2", "--", "true")
	if code != 75 || !strings.Contains(stderr, `all 2 permits of "e2e:sem" are held`) || strings.Contains(stderr, "another owner") {
		t.Errorf("try: expected 75 and \"all 2 permits … are held\", got %d:\n%s", code, stderr)
	}
	code, _, stderr = lh(t, env, "run", "--key", "e2e:sem", "--limit", "2", "-w", "0.2", "--", "true")
	if code != 75 || !strings.Contains(stderr, `within --wait 200ms: all 2 permits of "e2e:sem" are held`) {
		t.Errorf("--wait: expected 75 and \"all 2 permits … are held\", got %d:\n%s", code, stderr)
	}
	code, stdout, stderr := lh(t, env, "permits", "e2e:sem")
	if code != 0 || strings.Contains(stdout, `""`) || strings.Contains(stdout, "next") {
		t.Errorf("permits with nobody waiting: expected exit 0 and no empty next holder, got %d:\n%s%s", code, stdout, stderr)
	}
	for _, p := range holders {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		p.wait(10 * time.Second)
	}
}

// On SIGTERM, or SIGHUP (its terminal closed), elect says it resigned, and
// never that it campaigns again.
func TestElectInterruptMessage(t *testing.T) {
	srv := testredis.Start(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			up := filepath.Join(t.TempDir(), "up")
			p := start(t, storeEnv(srv), "elect", "--key", "e2e:elect-"+strconv.Itoa(int(sig)), "--", "sh", "-c", "echo up > "+up+"; exec sleep 30")
			waitFor(t, 10*time.Second, "the leader's command", func() bool { _, err := os.Stat(up); return err == nil })
			_ = p.cmd.Process.Signal(sig)
			p.wait(15 * time.Second)
			stderr := p.stderr.String()
			if strings.Contains(stderr, "campaigning again") || !strings.Contains(stderr, "interrupted; resigned") {
				t.Errorf("expected only \"interrupted; resigned\", got:\n%s", stderr)
			}
		})
	}
}
