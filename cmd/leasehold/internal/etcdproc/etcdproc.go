// Package etcdproc runs a single-member etcd server as a child process (the
// `etcd` binary from PATH, as the drill's Redis mode runs redis-server), on
// free loopback ports, in its own data directory. The drill uses it for its
// restart fault; the cmd module's tests use it through testetcd. Nothing here
// links an etcd server into the binary.
//
// The member runs with a short heartbeat (50 ms) and election timeout
// (500 ms), so a restarted member elects itself quickly; etcd's minimum lease
// TTL is then 1 s.
package etcdproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Timing of the member.
const (
	TickMs     = 50
	ElectionMs = 500
	readyWait  = 20 * time.Second
)

// ErrNoBinary means no `etcd` binary was found in PATH.
var ErrNoBinary = errors.New("etcdproc: etcd binary not found in PATH (Debian: apt-get install etcd-server)")

// Server is one etcd member running as a child process. Its methods are safe
// for concurrent use.
type Server struct {
	Dir        string // data directory (removed by Close)
	ClientAddr string // HOST:PORT of the client listener
	PeerAddr   string // HOST:PORT of the peer listener

	bin  string
	logs *os.File

	mu   sync.Mutex
	cmd  *exec.Cmd     // nil while stopped
	done chan struct{} // closed when cmd has been waited for
}

// Start starts a member in a new temporary directory and waits until it
// serves, or ctx ends.
func Start(ctx context.Context) (*Server, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, ErrNoBinary
	}
	dir, err := os.MkdirTemp("", "leasehold-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcdproc: data directory: %w", err)
	}
	s := &Server{Dir: dir, bin: bin}
	if s.ClientAddr, err = freeAddr(); err == nil {
		s.PeerAddr, err = freeAddr()
	}
	if err == nil {
		s.logs, err = os.Create(filepath.Join(dir, "etcd.log"))
	}
	if err == nil {
		err = s.start(ctx, "new")
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Endpoint is the client URL, http://HOST:PORT.
func (s *Server) Endpoint() string { return "http://" + s.ClientAddr }

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("etcdproc: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (s *Server) start(ctx context.Context, state string) error {
	peer := "http://" + s.PeerAddr
	cmd := exec.Command(s.bin,
		"--name", "m0",
		"--data-dir", filepath.Join(s.Dir, "member"),
		"--listen-client-urls", s.Endpoint(),
		"--advertise-client-urls", s.Endpoint(),
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "m0="+peer,
		"--initial-cluster-token", "leasehold",
		"--initial-cluster-state", state,
		"--heartbeat-interval", fmt.Sprint(TickMs),
		"--election-timeout", fmt.Sprint(ElectionMs),
		"--logger", "zap", "--log-level", "error",
	)
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdproc: start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := s.waitReady(ctx, done); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// waitReady polls the member's /health endpoint until it reports healthy
// (a leader was elected and the member serves).
func (s *Server) waitReady(ctx context.Context, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	for {
		if healthy(ctx, s.ClientAddr) {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("etcdproc: etcd on %s exited: %s", s.ClientAddr, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("etcdproc: etcd on %s not ready: %w: %s", s.ClientAddr, ctx.Err(), s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healthy asks GET /health over a plain connection, which keeps this package
// free of an HTTP client's idle connections.
func healthy(ctx context.Context, addr string) bool {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
		return false
	}
	buf := make([]byte, 512)
	var got []byte
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	ok := bytes.HasPrefix(got, []byte("HTTP/1.0 200")) || bytes.HasPrefix(got, []byte("HTTP/1.1 200"))
	return ok && bytes.Contains(got, []byte(`"health":"true"`))
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "etcd.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// Kill stops the member with SIGKILL, like a crash, and waits for the
// process to exit. It is a no-op while stopped.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

// Stop stops the member with SIGTERM and waits for it to exit.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-done
}

// Restart kills the member and starts it again on the same ports and data
// directory: etcd keeps every key and lease (and extends every lease by the
// election timeout when the member becomes leader again).
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	return s.start(ctx, "existing")
}

// Close kills the member and removes its data directory. It is idempotent.
func (s *Server) Close() {
	s.Kill()
	s.mu.Lock()
	logs := s.logs
	s.logs = nil
	s.mu.Unlock()
	if logs != nil {
		_ = logs.Close()
	}
	_ = os.RemoveAll(s.Dir)
}
