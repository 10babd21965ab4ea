package drill

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/redisproc"
)

// StoreRedisSentinel is the Config.Store value that makes the drill start
// its own Sentinel group on loopback (redisproc.StartSentinel: a master, two
// replicas, three sentinels) and run the replicas on go-redis's failover
// client, so the failover fault can promote a replica.
const StoreRedisSentinel = "redis-sentinel"

// failoverWait bounds how long the failover fault waits for the sentinels
// to agree on the new master.
const failoverWait = 30 * time.Second

// startSentinel starts the drill's Sentinel group, a fault proxy in front of
// each of its servers, and the observer's failover client (direct, no
// proxy); it sets the replicas' failover options.
func (b *redisBackend) startSentinel(ctx context.Context, cfg Config) error {
	g, err := redisproc.StartSentinel(ctx, redisproc.SentinelOptions{Bin: cfg.RedisServer})
	if err != nil {
		return setupError(err)
	}
	b.group = g
	b.atClose(g.Close)
	route := map[string]string{}
	for _, s := range append([]*redisproc.Server{g.Master}, g.Replicas...) {
		x, err := b.startProxy(s.Addr)
		if err != nil {
			return err
		}
		route[s.Addr] = x.Addr()
	}
	direct := &redis.FailoverOptions{
		MasterName: redisproc.SentinelMaster, SentinelAddrs: g.Sentinels, Protocol: 2, DisableIdentity: true,
		MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		ContextTimeoutEnabled: true,
	}
	b.setDirect(redis.NewFailoverClient(direct))
	replica := *direct
	t := cfg.clientTimeout()
	replica.DialTimeout, replica.ReadTimeout, replica.WriteTimeout = t, t, t
	replica.ContextTimeoutEnabled = true
	replica.DialerRetries = 1
	replica.PoolSize = 8
	// Data connections go through the server's fault proxy; the sentinels
	// are dialed directly (no fault reaches them).
	replica.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p, ok := route[addr]; ok {
			addr = p
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	b.failoverOpts = &replica
	return nil
}

// failover asks the sentinels for a failover and waits until they agree on
// the new master; mark is called as the request is sent. The note says
// which server was promoted and how long the sentinels took.
func (b *redisBackend) failover(ctx context.Context, mark func()) (string, error) {
	if b.group == nil {
		return "", fmt.Errorf("%w: no Sentinel group (use --store %s)", errRestartSkipped, StoreRedisSentinel)
	}
	old, err := b.group.MasterAddr(ctx)
	if err != nil {
		return "", err
	}
	how := "SENTINEL FAILOVER"
	start := time.Now()
	mark()
	if b.cfg.FailoverKill {
		how = "master killed (SIGKILL, stays down)"
		if s := b.group.Server(old); s != nil {
			s.Kill()
		}
	} else if err := b.group.Failover(ctx); err != nil {
		return "", err
	}
	nw, err := b.group.WaitNewMaster(ctx, old, failoverWait)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: master %s -> %s; the sentinels agreed on the new master after %v", how, old, nw, time.Since(start).Round(time.Millisecond)), nil
}
