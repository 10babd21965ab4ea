// Package testetcd starts real, embedded etcd servers (go.etcd.io/etcd/server/v3/embed)
// for tests: a single member or a cluster of several members, on free
// loopback ports, each in its own temporary data directory. Everything is
// stopped in t.Cleanup.
//
// Members run with a short heartbeat (50 ms) and election timeout (500 ms) so
// tests see leader elections quickly; with these settings etcd's minimum lease
// TTL is 1 s. fsync is disabled (data durability does not matter in tests) and
// the server logs only errors.
package testetcd

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
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

	mu   sync.Mutex
	etcd *embed.Etcd // nil while stopped
}

// Cluster is a set of embedded etcd members that form one cluster.
type Cluster struct {
	Members []*Member
	tb      testing.TB
}

// Start runs a single-member cluster and stops it in tb.Cleanup.
func Start(tb testing.TB) *Cluster { tb.Helper(); return StartCluster(tb, 1) }

// StartCluster runs an n-member cluster, waits until every member is ready
// (a leader was elected and every member published itself), and stops it in
// tb.Cleanup.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("testetcd: cluster size must be >= 1, got %d", n)
	}
	c := &Cluster{tb: tb}
	base := tb.TempDir()
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: "http://" + freeAddr(tb),
			PeerURL:   "http://" + freeAddr(tb),
			Dir:       fmt.Sprintf("%s/m%d", base, i),
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	tb.Cleanup(c.Close)
	for _, m := range c.Members {
		if err := m.start(strings.Join(initial, ","), embed.ClusterStateFlagNew); err != nil {
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

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return *u
}

// initial is the initial-cluster string, kept for restarts (ignored by etcd
// once the data directory exists).
func (m *Member) start(initial, state string) error {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.ListenClientUrls = []url.URL{mustURL(m.ClientURL)}
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	cfg.ListenPeerUrls = []url.URL{mustURL(m.PeerURL)}
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	cfg.InitialCluster = initial
	cfg.InitialClusterToken = "leasehold-test"
	cfg.ClusterState = state
	cfg.TickMs = TickMs
	cfg.ElectionMs = ElectionMs
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.etcd = e
	m.mu.Unlock()
	return nil
}

func (m *Member) waitReady() error {
	m.mu.Lock()
	e := m.etcd
	m.mu.Unlock()
	if e == nil {
		return fmt.Errorf("member %s is stopped", m.Name)
	}
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return err
	case <-t.C:
		return fmt.Errorf("not ready after %v", startTimeout)
	}
}

// Running reports whether the member is running.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil
}

// IsLeader reports whether the member is running and is the raft leader.
func (m *Member) IsLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd == nil {
		return false
	}
	s := m.etcd.Server
	return s.Leader() == s.MemberID()
}

// stop closes the member. Without graceful, the raft node is stopped first,
// without a leadership transfer, like a crash.
func (m *Member) stop(graceful bool) {
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e == nil {
		return
	}
	if !graceful {
		e.Server.HardStop()
	}
	e.Close()
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

// Kill stops member i abruptly: the raft node stops without handing over
// leadership, then its listeners close. The rest of the cluster notices by
// missing heartbeats and, when i was the leader, elects a new one.
func (c *Cluster) Kill(i int) { c.Members[i].stop(false) }

// Stop stops member i gracefully (a leader hands over leadership first).
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
	if err := m.start(strings.Join(initial, ","), embed.ClusterStateFlagExisting); err != nil {
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
