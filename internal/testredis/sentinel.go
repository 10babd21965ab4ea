package testredis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/redisproc"
)

// SentinelMaster is the master name a Sentinel group monitors.
const SentinelMaster = redisproc.SentinelMaster

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
// it, all on loopback (redisproc.StartSentinel, the launcher the drill uses
// too), stopped when the test ends.
type Sentinel struct {
	Master    *Server
	Replicas  []*Server
	Sentinels []string // host:port of each sentinel
	Link      *Proxy   // replica 0's link to the master when Lagging, else nil

	g *redisproc.Sentinel
}

// StartSentinel starts the group (redis-server --sentinel for the
// sentinels) and waits until every sentinel sees every replica and the other
// sentinels.
func StartSentinel(tb testing.TB, opts SentinelOptions) *Sentinel {
	tb.Helper()
	Binary(tb)
	s := &Sentinel{}
	ro := redisproc.SentinelOptions{Replicas: opts.Replicas, Sentinels: opts.Sentinels, DownAfter: opts.DownAfter, FailoverTimeout: opts.FailoverTimeout}
	if opts.Lagging {
		ro.Link = func(master string) (string, error) {
			s.Link = StartProxy(tb, master)
			return s.Link.Addr, nil
		}
	}
	g, err := redisproc.StartSentinel(context.Background(), ro)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(g.Close)
	s.g = g
	s.Master = &Server{Server: g.Master, tb: tb}
	for _, r := range g.Replicas {
		s.Replicas = append(s.Replicas, &Server{Server: r, tb: tb})
	}
	s.Sentinels = g.Sentinels
	return s
}

// MasterAddr returns the master's address as the first sentinel that
// answers reports it.
func (g *Sentinel) MasterAddr(ctx context.Context) (string, error) { return g.g.MasterAddr(ctx) }

// Failover asks the first sentinel for a failover (SENTINEL FAILOVER), as an
// operator would.
func (g *Sentinel) Failover(tb testing.TB) {
	tb.Helper()
	if err := g.g.Failover(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// WaitNewMaster waits until every sentinel names a master other than old
// and that server answers ROLE as a master, and returns its address.
func (g *Sentinel) WaitNewMaster(tb testing.TB, old string, within time.Duration) string {
	tb.Helper()
	addr, err := g.g.WaitNewMaster(context.Background(), old, within)
	if err != nil {
		tb.Fatal(err)
	}
	return addr
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
func (g *Sentinel) URL() string { return g.g.URL() }

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
