package testetcd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasehold/leasehold/internal/netns/netnstest"
)

// NetCluster is an etcd cluster of real `etcd` processes (the Debian
// etcd-server binary), one member per network namespace of a netns.Net, so
// a test can partition members from each other. Members talk to their peers
// over the namespaces' private network and listen for clients on a unix
// socket, which the test process reaches whatever the partition: a client
// of one member shares that member's side of the partition, like a process
// running on the member's machine.
type NetCluster struct {
	Net   *netnstest.Net
	Dir   string
	procs []*exec.Cmd
	tb    testing.TB
}

// StartNetCluster starts an n-member cluster in n new namespaces and waits
// until it has a leader. It skips the test when namespaces cannot be
// created or the etcd binary is missing; tb.Cleanup kills the members and
// removes the namespaces and files.
func StartNetCluster(tb testing.TB, n int) *NetCluster {
	tb.Helper()
	netnstest.Skip(tb)
	bin, err := exec.LookPath("etcd")
	if err != nil {
		tb.Skipf("testetcd: the etcd binary is missing (Debian package etcd-server; scripts/install-test-deps.sh installs it): %v", err)
	}
	// A short directory: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("/tmp", "lhetcd-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("testetcd: member logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	c := &NetCluster{Net: netnstest.New(tb, n), Dir: dir, tb: tb}
	tb.Cleanup(c.kill)
	var initial []string
	for i, nd := range c.Net.Nodes {
		initial = append(initial, fmt.Sprintf("m%d=http://%s:2380", i, nd.IP))
	}
	for i, nd := range c.Net.Nodes {
		peer := "http://" + nd.IP + ":2380"
		client := fmt.Sprintf("unix://m%d:2379", i) // a socket file named m<i>:2379 in the working directory
		cmd := nd.Command(bin, "--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("m%d.data", i)),
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "leasehold-netns",
			"--heartbeat-interval", "100", "--election-timeout", "1000") // etcd's defaults
		cmd.Dir = dir
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("m%d.log", i)))
		if err != nil {
			tb.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			_ = logf.Close()
			tb.Fatalf("testetcd: start member %d: %v", i, err)
		}
		_ = logf.Close()
		c.procs = append(c.procs, cmd)
	}
	if c.Leader(20*time.Second) < 0 {
		tb.Fatalf("testetcd: the namespaced cluster elected no leader in 20 s (logs in %s)", dir)
	}
	return c
}

// Endpoint returns member i's client URL.
func (c *NetCluster) Endpoint(i int) string {
	return "unix://" + filepath.Join(c.Dir, fmt.Sprintf("m%d:2379", i))
}

// Client returns a client of member i alone, closed in tb.Cleanup.
func (c *NetCluster) Client(tb testing.TB, i int) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{c.Endpoint(i)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leader returns the index of the member that a majority-connected member
// reports as leader (a member asked directly, each with a short timeout),
// or -1 when none does within timeout. A member cut off from the others may
// still believe it leads until its check-quorum step-down; only a member
// that is its own leader and reports a leader is counted.
func (c *NetCluster) Leader(timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for i := range c.procs {
			if c.isLeader(i) {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1
}

// LeaderAmong is Leader restricted to the given members.
func (c *NetCluster) LeaderAmong(timeout time.Duration, members ...int) int {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, i := range members {
			if c.isLeader(i) {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1
}

func (c *NetCluster) isLeader(i int) bool {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{c.Endpoint(i)}, DialTimeout: time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		return false
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	st, err := cli.Status(ctx, c.Endpoint(i))
	return err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId
}

func (c *NetCluster) kill() {
	for _, p := range c.procs {
		if p.Process != nil {
			_ = p.Process.Signal(syscall.SIGKILL)
			_ = p.Wait()
		}
	}
}
