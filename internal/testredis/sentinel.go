package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name a Sentinel group monitors.
const SentinelMaster = "leasehold"

// SentinelOptions configure StartSentinel. The zero value means one master,
// two replicas, three sentinels, quorum 2, down after 1 s, failover timeout
// 10 s.
type SentinelOptions struct {
	Replicas        int
	Sentinels       int
	DownAfter       time.Duration
	FailoverTimeout time.Duration
	// Lagging makes replica 0 replicate through a Proxy (Sentinel.Link) and
	// gives every other replica replica-priority 0, so replica 0 is the only
	// one Sentinel may promote: pause the link, write, kill the master and
	// cut the link, and the new master lacks those writes. Keep the test
	// shorter than FailoverTimeout: after it Sentinel points replica 0 at
	// the master directly.
	Lagging bool
}

// Sentinel is a Redis master, its replicas and the sentinels that monitor
// it, all on loopback, stopped when the test ends.
type Sentinel struct {
	Master    *Server
	Replicas  []*Server
	Sentinels []string // host:port of each sentinel
	Link      *Proxy   // replica 0's link to the master when Lagging, else nil
}

// StartSentinel starts the group (redis-server --sentinel for the
// sentinels) and waits until every sentinel sees every replica and the other
// sentinels.
func StartSentinel(tb testing.TB, opts SentinelOptions) *Sentinel {
	tb.Helper()
	opts = sentinelDefaults(opts)
	g := &Sentinel{Master: Start(tb)}
	for i := range opts.Replicas {
		target := g.Master.Addr
		prio := "100"
		switch {
		case opts.Lagging && i == 0:
			g.Link = StartProxy(tb, g.Master.Addr)
			target = g.Link.Addr
		case opts.Lagging:
			prio = "0"
		}
		host, port, _ := net.SplitHostPort(target)
		g.Replicas = append(g.Replicas, Start(tb, "--replicaof", host, port, "--replica-priority", prio))
	}
	for _, r := range g.Replicas {
		waitInfo(tb, r.Addr, "master_link_status:up")
	}
	for range opts.Sentinels {
		g.Sentinels = append(g.Sentinels, startSentinelProc(tb, g.Master.Port, opts))
	}
	want := []string{"num-slaves", strconv.Itoa(opts.Replicas), "num-other-sentinels", strconv.Itoa(opts.Sentinels - 1)}
	for _, a := range g.Sentinels {
		waitSentinel(tb, a, want)
	}
	return g
}

func sentinelDefaults(o SentinelOptions) SentinelOptions {
	if o.Replicas == 0 {
		o.Replicas = 2
	}
	if o.Sentinels == 0 {
		o.Sentinels = 3
	}
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 10 * time.Second
	}
	return o
}

func startSentinelProc(tb testing.TB, masterPort int, o SentinelOptions) string {
	tb.Helper()
	bin := Binary(tb)
	dir := tb.TempDir()
	port := FreePort(tb)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\n"+
		"sentinel monitor %s 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds %[3]s %[6]d\n"+
		"sentinel failover-timeout %[3]s %[7]d\n"+
		"sentinel parallel-syncs %[3]s 1\n",
		port, dir, SentinelMaster, masterPort, o.Sentinels/2+1, o.DownAfter.Milliseconds(), o.FailoverTimeout.Milliseconds())
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		tb.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, path, "--sentinel")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		tb.Fatalf("start sentinel: %v", err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			tb.Fatalf("sentinel on %s not ready: %v\n%s", addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitInfo waits until INFO replication of the server at addr contains want.
func waitInfo(tb testing.TB, addr, want string) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: no %q after 20s: %v\n%s", addr, want, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSentinel waits until SENTINEL MASTER on the sentinel at addr reports
// every field/value pair of want.
func waitSentinel(tb testing.TB, addr string, want []string) {
	tb.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := c.Master(context.Background(), SentinelMaster).Result()
		ok := err == nil
		for i := 0; ok && i+1 < len(want); i += 2 {
			ok = m[want[i]] == want[i+1]
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sentinel %s: expected %v after 30s, got %v, %v", addr, want, m, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MasterAddr returns the master's address as the first sentinel that
// answers reports it.
func (g *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var last error
	for _, a := range g.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		r, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		_ = c.Close()
		if err == nil && len(r) == 2 {
			return net.JoinHostPort(r[0], r[1]), nil
		}
		last = err
	}
	return "", fmt.Errorf("testredis: no sentinel names a master: %w", last)
}

// Failover asks the first sentinel for a failover (SENTINEL FAILOVER), as an
// operator would.
func (g *Sentinel) Failover(tb testing.TB) {
	tb.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinels[0]})
	defer c.Close()
	if err := c.Failover(context.Background(), SentinelMaster).Err(); err != nil {
		tb.Fatalf("SENTINEL FAILOVER: %v", err)
	}
}

// WaitNewMaster waits until every sentinel names a master other than old
// and that server answers ROLE as a master, and returns its address.
func (g *Sentinel) WaitNewMaster(tb testing.TB, old string, within time.Duration) string {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		if addr, ok := g.agreedMaster(old); ok {
			return addr
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testredis: no new master (other than %s) after %v", old, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (g *Sentinel) agreedMaster(old string) (string, bool) {
	ctx := context.Background()
	var agreed string
	for _, a := range g.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		r, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		_ = c.Close()
		if err != nil || len(r) != 2 {
			return "", false
		}
		addr := net.JoinHostPort(r[0], r[1])
		if addr == old || (agreed != "" && addr != agreed) {
			return "", false
		}
		agreed = addr
	}
	c := redis.NewClient(&redis.Options{Addr: agreed})
	defer c.Close()
	role, err := c.Do(ctx, "ROLE").Slice()
	return agreed, err == nil && len(role) > 0 && role[0] == "master"
}

// Server returns the server of the group listening on addr, or nil.
func (g *Sentinel) Server(addr string) *Server {
	for _, s := range append([]*Server{g.Master}, g.Replicas...) {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// URL returns the group's store URL in go-redis's ParseFailoverURL form:
// redis://SENTINEL?master_name=NAME&addr=SENTINEL2&addr=SENTINEL3.
func (g *Sentinel) URL() string {
	u := "redis://" + g.Sentinels[0] + "?master_name=" + SentinelMaster
	for _, a := range g.Sentinels[1:] {
		u += "&addr=" + a
	}
	return u
}

// Client returns a go-redis failover client (NewFailoverClient) over the
// group's sentinels, with ContextTimeoutEnabled, closed in t.Cleanup.
func (g *Sentinel) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            SentinelMaster,
		SentinelAddrs:         g.Sentinels,
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("ping master %s via sentinels %v: %v", SentinelMaster, g.Sentinels, err)
	}
	return c
}
