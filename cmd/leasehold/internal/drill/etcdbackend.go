package drill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/etcdproc"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/faultproxy"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/etcdstore"
)

// StoreEtcdServer is the Config.Store value that makes the drill start its
// own single-member etcd (the etcd binary from PATH, as a child process) on
// free loopback ports, so it can restart it.
const StoreEtcdServer = "etcd-server"

// Defaults on etcd, whose leases are whole seconds.
const (
	etcdDefaultTTL = 2 * time.Second
	etcdMinTTL     = time.Second
	// etcdExpiryCheck is how often the etcd leader looks for expired leases
	// (the lessor's fixed 500 ms), plus the raft round that deletes them.
	etcdExpiryCheck = 600 * time.Millisecond
)

// etcdBackend runs the drill on etcd. Every replica process has its own
// clientv3 client and etcdstore.Store; the client reaches etcd through one
// fault proxy per endpoint (gRPC is plain TCP to the proxy), reconnects
// quickly and bounds every store call by the renew timeout, so a fault shows
// up as an error. The observer has a direct client that no fault reaches.
type etcdBackend struct {
	cfg       Config
	base      clientv3.Config // endpoints and credentials of the real cluster
	proxies   []*faultproxy.Proxy
	server    *etcdproc.Server // nil unless the drill started it
	direct    *clientv3.Client
	obs       *etcdstore.Store
	prefix    string
	serverTTL time.Duration // the lease TTL etcd grants for cfg.TTL
	ctx       context.Context

	mu       sync.Mutex
	onRevive func() // called when a restart kept every lease (and extended it)
}

// etcdEndpoints parses an etcd:// store URL; the error never contains the
// password.
func etcdEndpoints(store string) (clientv3.Config, string, error) {
	cfg, prefix, err := etcdstore.ParseURL(store)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), etcdstore.ErrInvalidOptions.Error()+": ")
		return cfg, "", fmt.Errorf("%w: --store %s: %s", ErrInvalidConfig, storeurl.Describe(store), storeurl.RedactError(errors.New(msg), store))
	}
	return cfg, prefix, nil
}

func newEtcdBackend(ctx context.Context, cfg Config) (_ *etcdBackend, err error) {
	b := &etcdBackend{cfg: cfg, ctx: context.WithoutCancel(ctx)}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	basePrefix := ""
	if cfg.kind() == storeOwnEtcd {
		if b.server, err = etcdproc.Start(ctx); err != nil {
			if errors.Is(err, etcdproc.ErrNoBinary) {
				return nil, fmt.Errorf("%w: --store %s: %v", ErrInvalidConfig, StoreEtcdServer, err)
			}
			return nil, fmt.Errorf("%w: %v", ErrSetup, err)
		}
		b.base.Endpoints = []string{b.server.ClientAddr}
	} else if b.base, basePrefix, err = etcdEndpoints(cfg.Store); err != nil {
		return nil, err
	}
	where := strings.Join(b.base.Endpoints, ",")

	direct := b.base
	direct.DialTimeout = 3 * time.Second
	direct.Logger = zap.NewNop()
	if b.direct, err = clientv3.New(direct); err != nil {
		return nil, fmt.Errorf("%w: cannot reach etcd at %s: %v", ErrSetup, where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	b.prefix = basePrefix + "leasehold-drill/" + hex.EncodeToString(rnd[:]) + "/"
	if _, err := b.direct.Get(pctx, b.prefix, clientv3.WithCountOnly()); err != nil {
		return nil, fmt.Errorf("%w: etcd at %s does not answer: %v", ErrSetup, where, err)
	}
	// The TTL etcd grants: cfg.TTL rounded up to seconds, raised to the
	// cluster's minimum (1.5 × its election timeout).
	secs := int64((cfg.TTL + time.Second - 1) / time.Second)
	g, err := b.direct.Grant(pctx, secs)
	if err != nil {
		return nil, fmt.Errorf("%w: etcd at %s: grant a lease: %v", ErrSetup, where, err)
	}
	b.serverTTL = time.Duration(max(g.TTL, secs)) * time.Second
	_, _ = b.direct.Revoke(pctx, g.ID)

	for _, ep := range b.base.Endpoints {
		p, err := faultproxy.Start(strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSetup, err)
		}
		b.proxies = append(b.proxies, p)
	}
	if b.obs, err = etcdstore.New(b.direct, etcdstore.Options{Prefix: b.prefix, RequestTimeout: b.observeTimeout()}); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	return b, nil
}

// replicaConfig is one replica process's client configuration: the proxies,
// quick reconnects, no logging.
func (b *etcdBackend) replicaConfig() clientv3.Config {
	c := b.base
	c.Endpoints = nil
	for _, p := range b.proxies {
		c.Endpoints = append(c.Endpoints, p.Addr())
	}
	c.Logger = zap.NewNop()
	c.DialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: b.cfg.renewTimeout()},
		MinConnectTimeout: b.cfg.renewTimeout(),
	})}
	if c.Username != "" {
		// With credentials, clientv3.New authenticates while it dials:
		// bound that so a fault makes it fail instead of hang.
		c.DialTimeout = 2 * time.Second
	}
	return c
}

func (b *etcdBackend) open() (leasehold.Store, func(), error) {
	cfg := b.replicaConfig()
	var cli *clientv3.Client
	var err error
	// Without credentials New does not wait for the network. With them it
	// authenticates, which a fault (an outage, latency) may make fail for
	// a while: a process that starts then keeps trying.
	for range 20 {
		if cli, err = clientv3.New(cfg); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: etcd client: %v", ErrSetup, err)
	}
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: b.prefix, RequestTimeout: b.cfg.renewTimeout()})
	if err != nil {
		_ = cli.Close()
		return nil, nil, err
	}
	return s, func() {
		_ = s.Close()
		_ = cli.Close()
	}, nil
}

func (b *etcdBackend) observer() inspectStore        { return b.obs }
func (b *etcdBackend) observeTimeout() time.Duration { return 300 * time.Millisecond }

// maybeApplied: a failed call that is not an answer from etcd (a timeout, a
// cut connection) may have been applied.
func (b *etcdBackend) maybeApplied(err error) bool { return redisMaybeApplied(err) }

// lateness: a request the proxy was holding when the client gave up is still
// forwarded.
func (b *etcdBackend) lateness() time.Duration {
	late := 25 * time.Millisecond
	for _, f := range b.cfg.Faults {
		if f == FaultLatency {
			late += b.cfg.Latency
		}
	}
	return late
}

// expiryBound: etcd expires a lease TTL (whole seconds, at least the
// cluster's minimum) after its last grant or keep-alive, and the leader looks
// for expired leases every 500 ms.
func (b *etcdBackend) expiryBound() time.Duration { return b.serverTTL + etcdExpiryCheck }

func (b *etcdBackend) setDown(down bool) {
	for _, p := range b.proxies {
		_ = p.SetDown(down)
	}
}

func (b *etcdBackend) setLatency(d time.Duration) {
	for _, p := range b.proxies {
		_ = p.SetLatency(d)
	}
}

func (b *etcdBackend) dropReplies(rate float64) {
	for _, p := range b.proxies {
		_ = p.DropReplies(rate)
	}
}

// restart stops the drill's own member and starts it again on the same
// ports and data directory. etcd keeps its data: mark (data lost) is not
// called; every lease lives on, extended by the election timeout.
func (b *etcdBackend) restart(func()) error {
	if b.server == nil {
		return fmt.Errorf("%w: the drill did not start this etcd, so it does not restart it (use --store %s)", errRestartSkipped, StoreEtcdServer)
	}
	if err := b.server.Restart(b.ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrSetup, err)
	}
	b.mu.Lock()
	revive := b.onRevive
	b.mu.Unlock()
	if revive != nil {
		revive()
	}
	return nil
}

func (b *etcdBackend) restartNote() string {
	return "etcd member stopped and started again on its data directory: a restart, not a data loss (every lock, lease and revision kept; leases extended by the election timeout)"
}

func (b *etcdBackend) setOnRevive(f func()) {
	b.mu.Lock()
	b.onRevive = f
	b.mu.Unlock()
}

func (b *etcdBackend) heal() {
	for _, p := range b.proxies {
		_ = p.SetDown(false)
		_ = p.SetLatency(0)
		_ = p.DropReplies(0)
		_ = p.Blackhole(false)
	}
}

// close deletes the run's keys (best effort), then closes the clients, the
// proxies and the drill's own member.
func (b *etcdBackend) close() {
	if b.direct != nil && b.prefix != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = b.direct.Delete(ctx, b.prefix, clientv3.WithPrefix())
		cancel()
	}
	if b.obs != nil {
		_ = b.obs.Close()
	}
	if b.direct != nil {
		_ = b.direct.Close()
	}
	for _, p := range b.proxies {
		_ = p.Close()
	}
	if b.server != nil {
		b.server.Close()
	}
}
