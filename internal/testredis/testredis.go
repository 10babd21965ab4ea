// Package testredis starts a real redis-server on a free loopback port for
// tests and stops it when the test ends. `make test` installs redis-server
// (scripts/install-test-deps.sh); a test using this package fails, with a
// message saying so, when the binary is missing.
package testredis

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/redisproc"
)

// Server is one redis-server process (redisproc.Server) stopped at the end
// of its test.
type Server struct {
	*redisproc.Server
	tb testing.TB
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := redisproc.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// Binary returns the path of redis-server or fails the test.
func Binary(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server not found: run `make test` or scripts/install-test-deps.sh (Debian package redis-server)")
	}
	return p
}

// Start runs redis-server without persistence on a free loopback port, with
// extra command-line arguments (e.g. "--requirepass", "x"), and stops it in
// t.Cleanup.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return start(tb, redisproc.Options{Args: extra})
}

// StartTLS runs redis-server like Start, but it listens only for TLS on Port
// (the plain port is disabled). certFile and keyFile are the server's
// certificate and key in PEM; clients are not asked for certificates.
func StartTLS(tb testing.TB, certFile, keyFile string, extra ...string) *Server {
	tb.Helper()
	return start(tb, redisproc.Options{TLS: true, Args: append([]string{
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-auth-clients", "no",
	}, extra...)})
}

func start(tb testing.TB, opts redisproc.Options) *Server {
	tb.Helper()
	Binary(tb)
	opts.Dir = tb.TempDir()
	s, err := redisproc.Start(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return &Server{Server: s, tb: tb}
}

// Stop kills the server at once (no save, no goodbye), like a crash. It is a
// no-op when the server is not running.
func (s *Server) Stop() { s.Kill() }

// Restart kills the server and starts it again on the same port: without
// persistence every key is lost.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.Server.Restart(context.Background()); err != nil {
		s.tb.Fatal(err)
	}
}

// Client returns a go-redis client for the server, closed in t.Cleanup.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("ping %s: %v", s.Addr, err)
	}
	return c
}

// URL returns redis://ADDR.
func (s *Server) URL() string { return fmt.Sprintf("redis://%s", s.Addr) }

// Freeze stops the server process (SIGSTOP) without closing anything: open
// connections stay open and the kernel still accepts new ones, but nothing
// is answered, as with a hung server or a black-holed network. thaw resumes
// it (SIGCONT); Stop kills a frozen server as well.
func (s *Server) Freeze() (thaw func()) {
	s.tb.Helper()
	thaw, err := s.Server.Freeze()
	if err != nil {
		s.tb.Fatalf("Freeze: %v", err)
	}
	return thaw
}
