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
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name a Sentinel group monitors.
const SentinelMaster = "leasehold"

// SentinelOptions configure StartSentinel. The zero value means one master,
// two replicas, three sentinels, quorum 2, down after 1 s, failover timeout
// 10 s.
type SentinelOptions struct {
	Bin             string // redis-server binary; default "redis-server" on PATH
	Replicas        int
	Sentinels       int
	DownAfter       time.Duration
	FailoverTimeout time.Duration
	// Link, when set, gives replica 0 the address it replicates from (for
	// example a proxy in front of master) and makes every other replica
	// replica-priority 0, so replica 0 is the only one Sentinel may promote:
	// the setup for a failover to a lagging replica.
	Link func(master string) (string, error)
}

// Sentinel is a Redis master, its replicas and the sentinels that monitor
// it, all on loopback. Close stops every process.
type Sentinel struct {
	Master    *Server
	Replicas  []*Server
	Sentinels []string // host:port of each sentinel

	mu    sync.Mutex
	procs []*exec.Cmd // the sentinels
	dirs  []string
}

// StartSentinel starts the group (redis-server --sentinel for the
// sentinels) and waits until every sentinel sees every replica and the other
// sentinels, or ctx ends.
func StartSentinel(ctx context.Context, opts SentinelOptions) (_ *Sentinel, err error) {
	opts = sentinelDefaults(opts)
	g := &Sentinel{}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if g.Master, err = Start(ctx, Options{Bin: opts.Bin}); err != nil {
		return nil, err
	}
	for i := range opts.Replicas {
		target, prio := g.Master.Addr, "100"
		switch {
		case opts.Link != nil && i == 0:
			if target, err = opts.Link(g.Master.Addr); err != nil {
				return nil, fmt.Errorf("redisproc: replica link: %w", err)
			}
		case opts.Link != nil:
			prio = "0"
		}
		host, port, _ := net.SplitHostPort(target)
		r, err := Start(ctx, Options{Bin: opts.Bin, Args: []string{"--replicaof", host, port, "--replica-priority", prio}})
		if err != nil {
			return nil, err
		}
		g.Replicas = append(g.Replicas, r)
	}
	for _, r := range g.Replicas {
		if err := waitInfo(ctx, r.Addr, "master_link_status:up"); err != nil {
			return nil, err
		}
	}
	for range opts.Sentinels {
		addr, err := g.startSentinelProc(ctx, opts)
		if err != nil {
			return nil, err
		}
		g.Sentinels = append(g.Sentinels, addr)
	}
	want := []string{"num-slaves", strconv.Itoa(opts.Replicas), "num-other-sentinels", strconv.Itoa(opts.Sentinels - 1)}
	for _, a := range g.Sentinels {
		if err := waitSentinel(ctx, a, want); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func sentinelDefaults(o SentinelOptions) SentinelOptions {
	if o.Bin == "" {
		o.Bin = "redis-server"
	}
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

func (g *Sentinel) startSentinelProc(ctx context.Context, o SentinelOptions) (string, error) {
	bin, err := exec.LookPath(o.Bin)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrNoBinary, o.Bin, err)
	}
	dir, err := os.MkdirTemp("", "leasehold-sentinel-")
	if err != nil {
		return "", fmt.Errorf("redisproc: directory: %w", err)
	}
	g.mu.Lock()
	g.dirs = append(g.dirs, dir)
	g.mu.Unlock()
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\n"+
		"sentinel monitor %s 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds %[3]s %[6]d\n"+
		"sentinel failover-timeout %[3]s %[7]d\n"+
		"sentinel parallel-syncs %[3]s 1\n",
		port, dir, SentinelMaster, g.Master.Port, o.Sentinels/2+1, o.DownAfter.Milliseconds(), o.FailoverTimeout.Milliseconds())
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return "", fmt.Errorf("redisproc: sentinel config: %w", err)
	}
	logPath := filepath.Join(dir, "sentinel.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", fmt.Errorf("redisproc: sentinel log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, path, "--sentinel")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("redisproc: start sentinel: %w", err)
	}
	g.mu.Lock()
	g.procs = append(g.procs, cmd)
	g.mu.Unlock()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitDial(ctx, addr); err != nil {
		out, _ := os.ReadFile(logPath)
		return "", fmt.Errorf("redisproc: sentinel on %s not ready: %w: %s", addr, err, strings.TrimSpace(string(out)))
	}
	return addr, nil
}

func waitDial(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if !pause(ctx, 20*time.Millisecond) {
			return fmt.Errorf("%w (last dial: %v)", ctx.Err(), err)
		}
	}
}

// pause sleeps d, or less when ctx ends first (then it returns false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitInfo waits until INFO replication of the server at addr contains want.
func waitInfo(ctx context.Context, addr, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, want) {
			return nil
		}
		if !pause(ctx, 50*time.Millisecond) {
			return fmt.Errorf("redisproc: %s: no %q after 20s: %v\n%s", addr, want, err, info)
		}
	}
}

// waitSentinel waits until SENTINEL MASTER on the sentinel at addr reports
// every field/value pair of want.
func waitSentinel(ctx context.Context, addr string, want []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	for {
		m, err := c.Master(ctx, SentinelMaster).Result()
		ok := err == nil
		for i := 0; ok && i+1 < len(want); i += 2 {
			ok = m[want[i]] == want[i+1]
		}
		if ok {
			return nil
		}
		if !pause(ctx, 100*time.Millisecond) {
			return fmt.Errorf("redisproc: sentinel %s: expected %v after 30s, got %v, %v", addr, want, m, err)
		}
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
	return "", fmt.Errorf("redisproc: no sentinel names a master: %w", last)
}

// Failover asks the first sentinel for a failover (SENTINEL FAILOVER), as an
// operator would.
func (g *Sentinel) Failover(ctx context.Context) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinels[0]})
	defer c.Close()
	if err := c.Failover(ctx, SentinelMaster).Err(); err != nil {
		return fmt.Errorf("redisproc: SENTINEL FAILOVER: %w", err)
	}
	return nil
}

// ErrNoNewMaster is returned by WaitNewMaster when the sentinels did not
// agree on a new master in time.
var ErrNoNewMaster = errors.New("redisproc: no new master")

// WaitNewMaster waits until every sentinel names a master other than old
// and that server answers ROLE as a master, and returns its address.
func (g *Sentinel) WaitNewMaster(ctx context.Context, old string, within time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		if addr, ok := g.agreedMaster(ctx, old); ok {
			return addr, nil
		}
		if !pause(ctx, 20*time.Millisecond) {
			return "", fmt.Errorf("%w (other than %s) after %v", ErrNoNewMaster, old, within)
		}
	}
}

func (g *Sentinel) agreedMaster(ctx context.Context, old string) (string, bool) {
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
		if s != nil && s.Addr == addr {
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

// Close kills every sentinel and server of the group and removes their
// directories.
func (g *Sentinel) Close() {
	g.mu.Lock()
	procs, dirs := g.procs, g.dirs
	g.procs, g.dirs = nil, nil
	g.mu.Unlock()
	for _, cmd := range procs {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
	for _, s := range g.Replicas {
		s.Close()
	}
	if g.Master != nil {
		g.Master.Close()
	}
}
