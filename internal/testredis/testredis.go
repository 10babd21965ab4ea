// Package testredis starts a real redis-server on a free loopback port for
// tests and stops it when the test ends. `make test` installs redis-server
// (scripts/install-test-deps.sh); a test using this package fails, with a
// message saying so, when the binary is missing.
package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	Port int
	Dir  string
	args []string
	cmd  *exec.Cmd
	tb   testing.TB
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
	return start(tb, false, extra)
}

// StartTLS runs redis-server like Start, but it listens only for TLS on Port
// (the plain port is disabled). certFile and keyFile are the server's
// certificate and key in PEM; clients are not asked for certificates.
func StartTLS(tb testing.TB, certFile, keyFile string, extra ...string) *Server {
	tb.Helper()
	return start(tb, true, append([]string{
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-auth-clients", "no",
	}, extra...))
}

func start(tb testing.TB, tls bool, extra []string) *Server {
	tb.Helper()
	s := &Server{Port: FreePort(tb), Dir: tb.TempDir(), tb: tb}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	ports := []string{"--port", strconv.Itoa(s.Port)}
	if tls {
		ports = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port)}
	}
	s.args = append(append(ports,
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.Dir, "--daemonize", "no", "--loglevel", "warning",
	), extra...)
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.tb.Helper()
	s.cmd = exec.Command(Binary(s.tb), s.args...)
	logPath := filepath.Join(s.Dir, "redis.log") // the server's output; shown when it fails to start
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.tb.Fatalf("redis-server log: %v", err)
	}
	defer logf.Close()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Stop()
		out, _ := os.ReadFile(logPath)
		s.tb.Fatalf("redis-server on %s not ready: %v\n%s", s.Addr, err, out)
	}
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server at once (no save, no goodbye), like a crash. It is a
// no-op when the server is not running.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server and starts it again on the same port: without
// persistence every key is lost.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

// Client returns a go-redis client for the server, closed in t.Cleanup.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
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
	if s.cmd == nil || s.cmd.Process == nil {
		s.tb.Fatalf("Freeze: redis-server on %s is not running", s.Addr)
	}
	p := s.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		s.tb.Fatalf("Freeze: SIGSTOP redis-server: %v", err)
	}
	return func() { _ = p.Signal(syscall.SIGCONT) }
}
