package drill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/etcdproc"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
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
	// etcdLeaseSlack is what etcdstore adds to a lock's TTL (whole seconds)
	// when it grants the shared lease its locks of that TTL live on.
	etcdLeaseSlack = 1
)

// etcdBackend runs the drill on etcd. Every replica process has its own
// clientv3 client and etcdstore.Store; the client reaches etcd through one
// fault proxy per endpoint (gRPC is plain TCP to the proxy), reconnects
// quickly and bounds every store call by the renew timeout, so a fault shows
// up as an error. The observer has a direct client that no fault reaches.
type etcdBackend struct {
	proxied
	base      clientv3.Config  // endpoints and credentials of the real cluster
	server    *etcdproc.Server // nil unless the drill started it
	direct    *clientv3.Client
	obs       *etcdstore.Store
	prefix    string
	serverTTL time.Duration // the TTL etcd grants the store's shared lease for cfg.TTL
	ctx       context.Context
	// onRevive is called when a restart or a new leader kept every lease
	// (and extended it).
	onRevive func()
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

func newEtcdBackend(ctx context.Context, cfg Config, onRevive func()) (_ *etcdBackend, err error) {
	b := &etcdBackend{proxied: proxied{cfg: cfg}, ctx: context.WithoutCancel(ctx), onRevive: onRevive}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	basePrefix, err := b.startServer(ctx)
	if err != nil {
		return nil, err
	}
	where := strings.Join(b.base.Endpoints, ",")

	direct := b.base
	direct.DialTimeout = 3 * time.Second
	direct.Logger = zap.NewNop()
	if b.direct, err = clientv3.New(direct); err != nil {
		return nil, fmt.Errorf("%w: cannot reach etcd at %s: %v", ErrSetup, where, err)
	}
	b.atClose(func() { _ = b.direct.Close() })
	if b.part != nil {
		if err := b.waitLeader(ctx); err != nil {
			return nil, err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	b.prefix = basePrefix + "leasehold-drill/" + runID() + "/"
	if _, err := b.direct.Get(pctx, b.prefix, clientv3.WithCountOnly()); err != nil {
		return nil, fmt.Errorf("%w: etcd at %s does not answer: %v", ErrSetup, where, err)
	}
	// The TTL etcd grants the store's shared lease for cfg.TTL: rounded up
	// to seconds plus etcdstore's one second of slack, raised to the
	// cluster's minimum (1.5 × its election timeout).
	secs := int64((cfg.TTL+time.Second-1)/time.Second) + etcdLeaseSlack
	g, err := b.direct.Grant(pctx, secs)
	if err != nil {
		return nil, fmt.Errorf("%w: etcd at %s: grant a lease: %v", ErrSetup, where, err)
	}
	b.serverTTL = time.Duration(max(g.TTL, secs)) * time.Second
	_, _ = b.direct.Revoke(pctx, g.ID)

	for _, ep := range b.base.Endpoints {
		if b.part != nil {
			break // no fault proxy: the replicas talk to their member
		}
		if _, err := b.startProxy(strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://")); err != nil {
			return nil, err
		}
	}
	if b.obs, err = etcdstore.New(b.direct, etcdstore.Options{Prefix: b.prefix, RequestTimeout: b.observeTimeout()}); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	b.atClose(func() { _ = b.obs.Close() })
	b.atClose(func() { // the run's keys, best effort
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = b.direct.Delete(ctx, b.prefix, clientv3.WithPrefix())
	})
	return b, nil
}

// startServer starts the drill's own etcd (a member, or the partition
// fault's cluster), or parses Config.Store, and sets the endpoints; it
// returns the key prefix of the store URL.
func (b *etcdBackend) startServer(ctx context.Context) (prefix string, err error) {
	switch {
	case slices.Contains(b.cfg.Faults, FaultPartition):
		if b.part, b.base.Endpoints, err = startEtcdPartition(ctx); err == nil {
			b.atClose(b.part.close)
		}
	case b.cfg.kind() == storeOwnEtcd:
		if b.server, err = etcdproc.Start(ctx); err != nil {
			return "", startError(err, etcdproc.ErrNoBinary, StoreEtcdServer)
		}
		b.atClose(b.server.Close)
		b.base.Endpoints = []string{b.server.ClientAddr}
	default:
		b.base, prefix, err = etcdEndpoints(b.cfg.Store)
	}
	return prefix, err
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

// open connects replica id's process: through the fault proxies, or on the
// partition network to member id % 3 alone.
func (b *etcdBackend) open(id int) (driver.Store, func(), error) {
	cfg := b.replicaConfig()
	if b.part != nil {
		cfg.Endpoints = []string{b.base.Endpoints[id%etcdMembers]}
	}
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
	// What a holder left behind ends as after a real crash: etcd expires
	// the lease (see expiryBound).
	return s, processEnd(func() { _ = cli.Close() }, s), nil
}

func (b *etcdBackend) observer() inspectStore        { return b.obs }
func (b *etcdBackend) observeTimeout() time.Duration { return 300 * time.Millisecond }

// expiryBound: while a replica's store reaches etcd it deletes a lock
// nobody renews at its TTL; the store's shared lease is kept alive until
// then. When the store dies or loses etcd (crash, outage), etcd expires the
// lease its TTL (the lock's whole seconds + 1 s, at least the cluster's
// minimum) after the last keep-alive, and the leader looks for expired
// leases every 500 ms. So a lock ends at most TTL + lease TTL + that check
// after its last applied acquire or renew (docs/etcd.md, "A lock nobody
// renews").
func (b *etcdBackend) expiryBound() time.Duration {
	return b.cfg.TTL + b.serverTTL + etcdExpiryCheck
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
	b.onRevive()
	return nil
}

func (b *etcdBackend) restartNote() string {
	return "etcd member stopped and started again on its data directory: a restart, not a data loss (every lock, lease and revision kept; leases extended by the election timeout)"
}
