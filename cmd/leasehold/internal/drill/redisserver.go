package drill

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// redisServer is a redis-server process the drill started itself, on a
// free loopback port, without persistence: a restart loses every key.
type redisServer struct {
	bin, dir, addr string
	port           int
	cmd            *exec.Cmd
}

// startRedisServer starts bin (default: redis-server on PATH) on a free
// loopback port and waits until it accepts connections.
func startRedisServer(ctx context.Context, bin string) (*redisServer, error) {
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%w: --redis-server %q not found (install the Debian package redis-server or give its path): %v", ErrInvalidConfig, bin, err)
	}
	dir, err := os.MkdirTemp("", "leasehold-drill-redis-")
	if err != nil {
		return nil, fmt.Errorf("%w: redis-server directory: %v", ErrSetup, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: free port for redis-server: %v", ErrSetup, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &redisServer{bin: path, dir: dir, port: port, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	if err := s.start(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *redisServer) start(ctx context.Context) error {
	logPath := filepath.Join(s.dir, "redis.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%w: redis-server log: %v", ErrSetup, err)
	}
	defer logf.Close()
	s.cmd = exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no", "--loglevel", "warning")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return fmt.Errorf("%w: start redis-server: %v", ErrSetup, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.kill()
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("%w: redis-server on %s not ready: %v: %s", ErrSetup, s.addr, err, strings.TrimSpace(string(out)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the server at once, like a crash.
func (s *redisServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// restart kills the server and starts it again on the same port; mark is
// called once it is dead (its data gone).
func (s *redisServer) restart(ctx context.Context, mark func()) error {
	s.kill()
	mark()
	return s.start(ctx)
}

// stop kills the server and removes its directory.
func (s *redisServer) stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}
