// Package redisproc runs redis-server as a child process on a free loopback
// port, without persistence (a restart loses every key). It is the one
// launcher behind the tests' helper (internal/testredis) and the drill's
// --store redis-server mode.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoBinary means the redis-server binary was not found.
var ErrNoBinary = errors.New("redisproc: redis-server not found (Debian package redis-server)")

const readyWait = 10 * time.Second

// Options configure Start. The zero value is valid.
type Options struct {
	// Bin is the redis-server binary, a path or a name looked up in PATH.
	// Default "redis-server".
	Bin string
	// Dir is the server's working directory. Default: a new temporary
	// directory, removed by Close.
	Dir string
	// TLS makes the server listen only for TLS on Port (Args must name the
	// certificate and key).
	TLS bool
	// Args are extra command-line arguments, e.g. "--requirepass", "x".
	Args []string
}

// Server is one redis-server process. Its methods are safe for concurrent
// use.
type Server struct {
	Addr string // 127.0.0.1:PORT
	Port int
	Dir  string

	bin     string
	args    []string
	ownsDir bool

	mu  sync.Mutex
	cmd *exec.Cmd // nil while stopped
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisproc: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts a server and waits until it accepts connections (or ctx
// ends).
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin := opts.Bin
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrNoBinary, bin, err)
	}
	s := &Server{bin: path, Dir: opts.Dir}
	if s.Dir == "" {
		if s.Dir, err = os.MkdirTemp("", "leasehold-redis-"); err != nil {
			return nil, fmt.Errorf("redisproc: directory: %w", err)
		}
		s.ownsDir = true
	}
	if s.Port, err = FreePort(); err != nil {
		s.Close()
		return nil, err
	}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	ports := []string{"--port", strconv.Itoa(s.Port)}
	if opts.TLS {
		ports = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port)}
	}
	s.args = append(append(ports,
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.Dir, "--daemonize", "no", "--loglevel", "warning",
	), opts.Args...)
	if err := s.start(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	logPath := filepath.Join(s.Dir, "redis.log") // the server's output, shown when it fails to start
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("redisproc: log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisproc: start %s: %w", s.bin, err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	if err := s.waitReady(ctx); err != nil {
		s.Kill()
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("redisproc: redis-server on %s not ready: %w: %s", s.Addr, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last dial: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill stops the server at once (SIGKILL: no save, no goodbye), like a
// crash. It is a no-op while the server is stopped.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Restart kills the server (if running) and starts it again on the same port
// and directory: without persistence every key is lost.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	return s.start(ctx)
}

// Close kills the server and removes its directory when Start created it.
func (s *Server) Close() {
	s.Kill()
	if s.ownsDir {
		_ = os.RemoveAll(s.Dir)
	}
}

// Freeze stops the server process (SIGSTOP) without closing anything, as
// with a hung server or a black-holed network; thaw resumes it (SIGCONT).
// Kill works on a frozen server too.
func (s *Server) Freeze() (thaw func(), err error) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil, fmt.Errorf("redisproc: redis-server on %s is not running", s.Addr)
	}
	p := cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("redisproc: SIGSTOP redis-server: %w", err)
	}
	return func() { _ = p.Signal(syscall.SIGCONT) }, nil
}
