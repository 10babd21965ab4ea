package testredis

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

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/netns"
	"github.com/leasehold/leasehold/internal/netns/netnstest"
)

// NetSentinel is a Sentinel group spread over three network namespaces
// (netns.Net): node i runs a redis-server on NodeAddr(i, 6379), node 0 the
// master and nodes 1 and 2 its replicas, and a sentinel on port 26379
// (quorum 2, down after 1 s). Clients dial through a node's namespace
// (Client), so cutting node 0 partitions the master, its sentinel and the
// clients of node 0 from the rest.
type NetSentinel struct {
	Net       *netnstest.Net
	Sentinels []string // host:port of each sentinel, inside the Net
	procs     []*exec.Cmd
}

// NodeAddr returns host:port of port on node i of g.
func (g *NetSentinel) NodeAddr(i, port int) string {
	return fmt.Sprintf("%s:%d", g.Net.Nodes[i].IP, port)
}

// StartNetSentinel starts the group; serverArgs are added to every
// redis-server's command line (e.g. "--min-replicas-to-write", "1"). It
// skips the test when namespaces cannot be created and waits until every
// sentinel sees both replicas and the other sentinels.
func StartNetSentinel(tb testing.TB, serverArgs ...string) *NetSentinel {
	tb.Helper()
	netnstest.Skip(tb)
	bin := Binary(tb)
	dir := tb.TempDir()
	g := &NetSentinel{Net: netnstest.New(tb, 3)}
	tb.Cleanup(g.kill)
	master := g.Net.Nodes[0].IP
	for i, nd := range g.Net.Nodes {
		args := append([]string{"--port", "6379", "--bind", nd.IP, "--save", "", "--appendonly", "no",
			"--dir", dir, "--dbfilename", fmt.Sprintf("dump%d.rdb", i), "--protected-mode", "no"}, serverArgs...)
		if i > 0 {
			args = append(args, "--replicaof", master, "6379")
		}
		g.start(tb, nd, dir, fmt.Sprintf("redis%d", i), bin, args...)
	}
	for i := 1; i < len(g.Net.Nodes); i++ {
		g.waitInfo(tb, i, "master_link_status:up")
	}
	for i, nd := range g.Net.Nodes {
		conf := filepath.Join(dir, fmt.Sprintf("sentinel%d.conf", i))
		text := fmt.Sprintf("port 26379\nbind %s\ndaemonize no\ndir %s\nprotected-mode no\n"+
			"sentinel monitor %s %s 6379 2\nsentinel down-after-milliseconds %[3]s 1000\n"+
			"sentinel failover-timeout %[3]s 10000\nsentinel parallel-syncs %[3]s 1\n",
			nd.IP, dir, SentinelMaster, master)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			tb.Fatal(err)
		}
		g.start(tb, nd, dir, fmt.Sprintf("sentinel%d", i), bin, conf, "--sentinel")
		g.Sentinels = append(g.Sentinels, g.NodeAddr(i, 26379))
	}
	for i := range g.Sentinels {
		g.waitSentinel(tb, i)
	}
	return g
}

func (g *NetSentinel) start(tb testing.TB, nd *netns.Node, dir, name, bin string, args ...string) {
	tb.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	cmd := nd.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testredis: start %s: %v", name, err)
	}
	g.procs = append(g.procs, cmd)
}

func (g *NetSentinel) kill() {
	for _, p := range g.procs {
		_ = p.Process.Signal(syscall.SIGKILL)
		_ = p.Wait()
	}
}

// Options returns the options of a Sentinel failover client that dials
// from node i's namespace (like a process on that node). Its list of
// sentinels starts with node i's own, but go-redis shuffles the list and
// keeps the first sentinel that answers, which may be on another node.
func (g *NetSentinel) Options(i int) *redis.FailoverOptions {
	addrs := append([]string{g.Sentinels[i]}, g.Sentinels[:i]...)
	addrs = append(addrs, g.Sentinels[i+1:]...)
	return &redis.FailoverOptions{
		MasterName:            SentinelMaster,
		SentinelAddrs:         addrs,
		Dialer:                g.Net.Nodes[i].Dialer(time.Second),
		DialTimeout:           500 * time.Millisecond,
		ContextTimeoutEnabled: true,
	}
}

// Client returns a failover client with Options(i), closed in tb.Cleanup.
func (g *NetSentinel) Client(tb testing.TB, i int) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(g.Options(i))
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Direct returns a plain client of addr dialling from node i, closed in
// tb.Cleanup.
func (g *NetSentinel) Direct(tb testing.TB, i int, addr string) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: g.Net.Nodes[i].Dialer(time.Second),
		DialTimeout: 500 * time.Millisecond, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

func (g *NetSentinel) waitInfo(tb testing.TB, i int, want string) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: g.NodeAddr(i, 6379), Dialer: g.Net.Nodes[i].Dialer(time.Second)})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testredis: node %d: no %q after 20 s: %v", i, want, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (g *NetSentinel) waitSentinel(tb testing.TB, i int) {
	tb.Helper()
	c := redis.NewSentinelClient(&redis.Options{ContextTimeoutEnabled: true, Addr: g.Sentinels[i], Dialer: g.Net.Nodes[i].Dialer(time.Second)})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := c.Master(context.Background(), SentinelMaster).Result()
		if err == nil && m["num-slaves"] == "2" && m["num-other-sentinels"] == "2" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testredis: sentinel %d does not see the group after 30 s: %v, %v", i, m, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MasterFrom returns the master's address as the sentinel of node i
// reports it.
func (g *NetSentinel) MasterFrom(ctx context.Context, i int) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{ContextTimeoutEnabled: true, Addr: g.Sentinels[i], Dialer: g.Net.Nodes[i].Dialer(time.Second)})
	defer c.Close()
	r, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil || len(r) != 2 {
		return "", fmt.Errorf("testredis: sentinel %d names no master: %v", i, err)
	}
	return r[0] + ":" + r[1], nil
}
