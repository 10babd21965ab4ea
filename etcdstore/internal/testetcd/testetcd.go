// Package testetcd starts real etcd servers for tests: an etcd binary of the
// client's version (see Bin), a single member or a cluster of several members,
// on free loopback ports, each in its own temporary data directory.
// Everything is stopped in t.Cleanup. The members are processes, not an
// embedded server, so that the etcd server's modules stay out of
// etcdstore's go.mod and out of its users' module graphs (issue 31).
//
// Members run with a short heartbeat (50 ms) and election timeout (500 ms) so
// tests see leader elections quickly; with these settings etcd's minimum lease
// TTL is 1 s. fsync is off where the binary allows it, and the server logs
// only errors, to its directory.
package testetcd

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Timing of the test members.
const (
	TickMs     = 50
	ElectionMs = 500
	// startTimeout bounds the wait for a member or the cluster to be ready.
	startTimeout = 30 * time.Second
)

// Member is one etcd server of a Cluster.
type Member struct {
	Name      string
	ClientURL string // http://127.0.0.1:PORT
	PeerURL   string
	Dir       string

	bin string

	mu   sync.Mutex
	cmd  *exec.Cmd     // nil while stopped
	done chan struct{} // closed when cmd has exited
	cli  *clientv3.Client
}

// Cluster is a set of etcd members that form one cluster.
type Cluster struct {
	Members []*Member
	tb      testing.TB
}

// Bin returns the etcd binary: $LEASEHOLD_ETCD; else etcd-VERSION, of the
// version of the etcd client the tests link, on PATH or in $GOPATH/bin
// (scripts/install-test-deps.sh builds it from the module proxy: Debian's
// etcd-server is 3.4); else etcd on PATH. It fails the test when there is
// none.
func Bin(tb testing.TB) string {
	tb.Helper()
	if b := os.Getenv("LEASEHOLD_ETCD"); b != "" {
		return b
	}
	if v := clientVersion(); v != "" {
		name := "etcd-" + v
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, _ := os.UserHomeDir()
			gopath = filepath.Join(home, "go")
		}
		p := filepath.Join(filepath.SplitList(gopath)[0], "bin", name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	b, err := exec.LookPath("etcd")
	if err != nil {
		tb.Fatalf("testetcd: no etcd binary (run scripts/install-test-deps.sh, or set LEASEHOLD_ETCD): %v", err)
	}
	return b
}

// clientVersion is the version of the etcd API and client packages the
// tests link, e.g. v3.7.3 (a test binary carries no module versions in its
// build information).
func clientVersion() string { return "v" + version.Version }

var noFsync sync.Map // binary path -> []string: the flag, where etcd has it

// fsyncFlags returns --unsafe-no-fsync where the binary knows it (etcd
// 3.5 and later): data durability does not matter in tests.
func fsyncFlags(bin string) []string {
	if v, ok := noFsync.Load(bin); ok {
		return v.([]string)
	}
	var flags []string
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	if strings.Contains(string(out), "--unsafe-no-fsync") {
		flags = []string{"--unsafe-no-fsync"}
	}
	noFsync.Store(bin, flags)
	return flags
}

// Start runs a single-member cluster and stops it in tb.Cleanup.
func Start(tb testing.TB) *Cluster { tb.Helper(); return StartCluster(tb, 1) }

// StartCluster runs an n-member cluster, waits until every member is ready
// (a leader was elected and every member serves clients), and stops it in
// tb.Cleanup.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("testetcd: cluster size must be >= 1, got %d", n)
	}
	bin := Bin(tb)
	c := &Cluster{tb: tb}
	base := tb.TempDir()
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: "http://" + freeAddr(tb),
			PeerURL:   "http://" + freeAddr(tb),
			Dir:       fmt.Sprintf("%s/m%d", base, i),
			bin:       bin,
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	tb.Cleanup(c.Close)
	for _, m := range c.Members {
		if err := m.start(strings.Join(initial, ","), "new"); err != nil {
			tb.Fatalf("testetcd: start %s: %v", m.Name, err)
		}
	}
	for _, m := range c.Members {
		if err := m.waitReady(); err != nil {
			tb.Fatalf("testetcd: %s not ready: %v", m.Name, err)
		}
	}
	return c
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testetcd: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs the member's process; initial is the initial-cluster string,
// kept for restarts (ignored by etcd once the data directory exists).
func (m *Member) start(initial, state string) error {
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return err
	}
	logs, err := os.OpenFile(filepath.Join(m.Dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logs.Close() // the child keeps its own descriptor
	cmd := exec.Command(m.bin, append(fsyncFlags(m.bin),
		"--name", m.Name,
		"--data-dir", filepath.Join(m.Dir, "data"),
		"--listen-client-urls", m.ClientURL,
		"--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL,
		"--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", initial,
		"--initial-cluster-token", "leasehold-test",
		"--initial-cluster-state", state,
		"--heartbeat-interval", fmt.Sprint(TickMs),
		"--election-timeout", fmt.Sprint(ElectionMs),
		"--logger", "zap", "--log-level", "error",
	)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	// The member dies with the test process, also when the test binary is
	// killed.
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", m.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	return nil
}

// client returns a client of this member alone, made once.
func (m *Member) client() (*clientv3.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cli == nil {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{m.ClientURL},
			DialTimeout: 2 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return nil, err
		}
		m.cli = cli
	}
	return m.cli, nil
}

// status asks the member for its raft status.
func (m *Member) status(timeout time.Duration) (*clientv3.StatusResponse, error) {
	cli, err := m.client()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return cli.Status(ctx, m.ClientURL)
}

// waitReady waits until the member serves clients and knows a leader.
func (m *Member) waitReady() error {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done == nil {
		return fmt.Errorf("member %s is stopped", m.Name)
	}
	deadline := time.Now().Add(startTimeout)
	var last error
	for {
		st, err := m.status(time.Second)
		if err == nil && st.Leader != 0 {
			return nil
		}
		last = err
		select {
		case <-done:
			return fmt.Errorf("exited: %s", m.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v (%v): %s", startTimeout, last, m.logTail())
		}
	}
}

func (m *Member) logTail() string {
	b, _ := os.ReadFile(filepath.Join(m.Dir, "etcd.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// PID returns the member's process id, 0 while it is stopped.
func (m *Member) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.cmd.Process == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Running reports whether the member is running.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}

// IsLeader reports whether the member is running and is the raft leader.
func (m *Member) IsLeader() bool {
	if !m.Running() {
		return false
	}
	st, err := m.status(500 * time.Millisecond)
	return err == nil && st.Header != nil && st.Leader == st.Header.MemberId
}

// stop ends the member's process: SIGKILL without graceful, like a crash
// (no leadership transfer), else SIGTERM (etcd hands over leadership and
// closes its listeners first).
func (m *Member) stop(graceful bool) {
	m.mu.Lock()
	cmd, done, cli := m.cmd, m.done, m.cli
	m.cmd, m.done, m.cli = nil, nil, nil
	m.mu.Unlock()
	if cli != nil {
		_ = cli.Close()
	}
	if cmd == nil {
		return
	}
	sig := syscall.SIGKILL
	if graceful {
		sig = syscall.SIGTERM
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Endpoints returns the client URLs of every member (also stopped ones: the
// etcd client fails over between them).
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.ClientURL
	}
	return out
}

// Client returns an etcd client for all members, closed in tb.Cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("testetcd: client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leader returns the index of the current leader, waiting up to timeout for
// a running member to be elected; it fails the test when none is.
func (c *Cluster) Leader(timeout time.Duration) int {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for i, m := range c.Members {
			if m.IsLeader() {
				return i
			}
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("testetcd: no leader elected within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill stops member i abruptly (SIGKILL): no leadership hand-over. The rest
// of the cluster notices by missing heartbeats and, when i was the leader,
// elects a new one.
func (c *Cluster) Kill(i int) { c.Members[i].stop(false) }

// Stop stops member i gracefully (SIGTERM: a leader hands over leadership
// first).
func (c *Cluster) Stop(i int) { c.Members[i].stop(true) }

// Restart starts a stopped member i again from its data directory on the
// same ports and waits until it is ready (which needs a quorum).
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	m := c.Members[i]
	if m.Running() {
		c.tb.Fatalf("testetcd: restart %s: still running", m.Name)
	}
	var initial []string
	for _, o := range c.Members {
		initial = append(initial, o.Name+"="+o.PeerURL)
	}
	if err := m.start(strings.Join(initial, ","), "existing"); err != nil {
		c.tb.Fatalf("testetcd: restart %s: %v", m.Name, err)
	}
	if err := m.waitReady(); err != nil {
		c.tb.Fatalf("testetcd: restart %s: %v", m.Name, err)
	}
}

// Close stops every member: the followers first, then the leader, each
// gracefully, so no member is left trying to reach the others. It is called
// by tb.Cleanup and is idempotent.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		if !m.IsLeader() {
			m.stop(true)
		}
	}
	for _, m := range c.Members {
		m.stop(true)
	}
}

// Ready waits until a linearizable read through cli succeeds, up to timeout.
func Ready(ctx context.Context, cli *clientv3.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		_, err := cli.Get(ctx, "leasehold-testetcd-ready")
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testetcd: cluster not serving within %v: %w", timeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Metric returns the value of the unlabelled Prometheus metric name that
// member i serves on /metrics (e.g. etcd_server_proposals_committed_total).
func (c *Cluster) Metric(tb testing.TB, i int, name string) float64 {
	tb.Helper()
	resp, err := http.Get(c.Members[i].ClientURL + "/metrics")
	if err != nil {
		tb.Fatalf("testetcd: metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				tb.Fatalf("testetcd: metric %s: %v", name, err)
			}
			return f
		}
	}
	tb.Fatalf("testetcd: no metric %s on %s/metrics (%v)", name, c.Members[i].ClientURL, sc.Err())
	return 0
}
