package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// bin is the leasehold binary, built once by TestMain (with -race when the
// tests run with -race).
var bin string

// buildTags are the Makefile's BUILD_TAGS, so that these tests run the
// binary README documents (scripts/check-binary-size.sh checks they agree).
const buildTags = "grpcnotrace,nethttpomithttp2"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "leasehold-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "leasehold")
	args := []string{"build", "-tags", buildTags, "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := 0
	func() {
		defer os.RemoveAll(dir)
		goleak.VerifyTestMain(exitCatcher{m, &code})
	}()
	os.Exit(code)
}

// exitCatcher lets TestMain clean up after goleak.VerifyTestMain, which
// calls os.Exit itself.
type exitCatcher struct {
	m    *testing.M
	code *int
}

func (e exitCatcher) Run() int { *e.code = e.m.Run(); return *e.code }

// proc is one leasehold process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	start  time.Time
	done   chan struct{}
	code   int
	group  bool // leads a process group of its own (startInGroup)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs leasehold with args and env (added to a clean environment) in
// the background. It is killed in t.Cleanup if still running.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, env, false, args...)
}

// startInGroup is start with leasehold in a process group of its own, as
// under timeout(1) or a shell's job control.
func startInGroup(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, env, true, args...)
}

func startProc(t *testing.T, env []string, group bool, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "GORACE=atexit_sleep_ms=0"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	p := &proc{t: t, cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{}), group: group}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	cmd.WaitDelay = 5 * time.Second
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start leasehold: %v", err)
	}
	go func() {
		defer close(p.done)
		err := cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		}
		_ = err
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits up to limit for the process to exit and returns its status.
func (p *proc) wait(limit time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(limit):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("leasehold %q did not exit within %v\nstdout: %s\nstderr: %s", p.cmd.Args[1:], limit, p.stdout, p.stderr)
		return -1
	}
}

// lh runs leasehold to completion (at most 30 s).
func lh(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := start(t, env, args...)
	code = p.wait(30 * time.Second)
	return code, p.stdout.String(), p.stderr.String()
}

// waitFor polls cond every 20 ms for up to limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

func noPanic(t *testing.T, out ...string) {
	t.Helper()
	for _, s := range out {
		if strings.Contains(s, "panic") || strings.Contains(s, "goroutine ") {
			t.Errorf("output has a panic or stack trace:\n%s", s)
		}
	}
}
