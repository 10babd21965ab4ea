package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/faultproxy"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/redisproc"
	"github.com/leasehold/leasehold/redisstore"
)

// StoreRedisServer is the Config.Store value that makes the drill start its
// own redis-server (Config.RedisServer) on a free loopback port, without
// persistence, so it can restart it.
const StoreRedisServer = "redis-server"

// redisBackend runs the drill on Redis. Every replica process has its own
// go-redis client that connects through a fault proxy, with short timeouts
// and no retries so a fault shows up as an error; the observer (the sampler
// and the ownership checks) has a direct client that no fault reaches.
type redisBackend struct {
	proxied
	opts   *redis.Options // the replicas' options, Addr set to the proxy
	proxy  *faultproxy.Proxy
	server *redisproc.Server // nil unless the drill started it
	// group is the drill's Sentinel group (StoreRedisSentinel), else nil;
	// failoverOpts are then the replicas' client options.
	group        *redisproc.Sentinel
	failoverOpts *redis.FailoverOptions
	direct       *redis.Client
	obs          *redisstore.Store
	prefix       string
	ctx          context.Context // for restarts
	// url is what a worker process (Config.Processes) parses for its
	// client options before it points them at the proxy; it carries the
	// password and is never printed.
	url string
}

// redisOptions parses a redis:// or rediss:// URL, or returns the options of
// the drill's own server; the error never contains the password.
func redisOptions(store string) (*redis.Options, error) {
	opts, err := redis.ParseURL(store)
	if err != nil {
		return nil, fmt.Errorf("%w: --store %s: %s", ErrInvalidConfig, storeurl.Describe(store), storeurl.RedactError(err, store))
	}
	if _, _, err := net.SplitHostPort(opts.Addr); err != nil {
		return nil, fmt.Errorf("%w: --store %s: address %q: %v", ErrInvalidConfig, storeurl.Describe(store), opts.Addr, err)
	}
	return opts, nil
}

func newRedisBackend(ctx context.Context, cfg Config) (_ *redisBackend, err error) {
	b := &redisBackend{proxied: proxied{cfg: cfg}, ctx: context.WithoutCancel(ctx)}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if cfg.kind() == storeOwnSentinel {
		if err := b.startSentinel(ctx, cfg); err != nil {
			return nil, err
		}
		return b, b.openObserver(ctx, "the Sentinel group's master")
	}
	if slices.Contains(cfg.Faults, FaultPartition) {
		return b, b.openPartition(ctx, cfg)
	}
	var opts *redis.Options
	if cfg.kind() == storeOwnRedis {
		if b.server, err = startRedisServer(ctx, cfg.RedisServer); err != nil {
			return nil, err
		}
		b.atClose(b.server.Close)
		b.url = "redis://" + b.server.Addr
	} else {
		b.url = cfg.Store
	}
	if opts, err = baseOptions(b.url); err != nil {
		return nil, err
	}

	direct := *opts
	direct.MaxRetries = -1
	direct.DialTimeout, direct.ReadTimeout, direct.WriteTimeout = time.Second, time.Second, time.Second
	b.setDirect(redis.NewClient(&direct))
	if err := b.openObserver(ctx, "Redis at "+opts.Addr); err != nil {
		return nil, err
	}
	if b.proxy, err = b.startProxy(opts.Addr); err != nil {
		return nil, err
	}
	b.opts = replicaOptions(opts, b.proxy.Addr(), cfg)
	return b, nil
}

// openObserver checks that the direct client reaches Redis (where) and
// opens the observer's store under a prefix of this run.
func (b *redisBackend) openObserver(ctx context.Context, where string) error {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := b.direct.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("%w: cannot reach %s: %v", ErrSetup, where, err)
	}
	b.prefix = "leasehold-drill:" + runID() + ":"
	var err error
	if b.obs, err = redisstore.New(b.direct, b.storeOptions()); err != nil {
		return fmt.Errorf("%w: %v", ErrSetup, err)
	}
	b.atClose(func() { _ = b.obs.Close() })
	if b.cfg.kind() == storeRedis { // not the drill's own: delete the run's keys
		b.atClose(func() { deleteKeys(b.direct, b.prefix, 2*time.Second) })
	}
	return nil
}

// deleteKeys deletes the keys under prefix, best effort within timeout.
func deleteKeys(c *redis.Client, prefix string, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		_ = c.Del(ctx, keys...).Err()
	}
}

// setDirect sets the direct client, closed by close.
func (b *redisBackend) setDirect(c *redis.Client) {
	b.direct = c
	b.atClose(func() { _ = c.Close() })
}

// baseOptions parses the store URL and sets what every client of the drill
// shares.
func baseOptions(url string) (*redis.Options, error) {
	opts, err := redisOptions(url)
	if err != nil {
		return nil, err
	}
	if opts.Protocol == 0 {
		opts.Protocol = 2 // no HELLO round trip on every new connection
	}
	opts.DisableIdentity = true
	opts.ContextTimeoutEnabled = true // redisstore.New requires it
	return opts, nil
}

// replicaOptions are one replica process's client options: through the
// proxy, short timeouts, no retries.
func replicaOptions(base *redis.Options, proxy string, cfg Config) *redis.Options {
	replica := *base
	replica.Addr = proxy
	t := cfg.clientTimeout()
	replica.DialTimeout, replica.ReadTimeout, replica.WriteTimeout = t, t, t
	replica.ContextTimeoutEnabled = true
	replica.MaxRetries = -1 // no retries: a fault shows up as an error
	replica.DialerRetries = 1
	replica.PoolSize = 8
	return &replica
}

// storeOptions: a prefix unique to this run, and fence counters that do not
// outlive it by much.
func (b *redisBackend) storeOptions() redisstore.Options { return runStoreOptions(b.prefix) }

func runStoreOptions(prefix string) redisstore.Options {
	return redisstore.Options{Prefix: prefix, FenceRetention: time.Minute}
}

// clientTimeout is the replicas' dial, read and write timeout: short, and
// never above the renew timeout.
func (c Config) clientTimeout() time.Duration {
	return min(200*time.Millisecond, c.renewTimeout())
}

// open connects replica id's process: through the fault proxy, or on the
// partition network from the replica's own node.
func (b *redisBackend) open(id int) (driver.Store, func(), error) {
	var c redis.UniversalClient
	switch {
	case b.failoverOpts != nil:
		c = redis.NewFailoverClient(b.failoverOpts)
	case b.part != nil:
		o := *b.opts
		o.Dialer = b.part.net.Nodes[id+1].Dialer(b.cfg.clientTimeout())
		c = redis.NewClient(&o)
	default:
		c = redis.NewClient(b.opts)
	}
	s, err := redisstore.New(c, b.storeOptions())
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return s, processEnd(func() { _ = c.Close() }, s), nil
}

func (b *redisBackend) observer() inspectStore        { return b.obs }
func (b *redisBackend) observeTimeout() time.Duration { return 100 * time.Millisecond }

func (b *redisBackend) expiryBound() time.Duration { return b.cfg.TTL }

func (b *redisBackend) restart(mark func()) error {
	if b.group != nil {
		return fmt.Errorf("%w: on a Sentinel group the drill fails the master over instead (--faults failover)", errRestartSkipped)
	}
	if b.server == nil {
		return fmt.Errorf("%w: the drill did not start this Redis, so it does not restart it (use --store %s)", errRestartSkipped, StoreRedisServer)
	}
	b.server.Kill()
	mark() // the data is gone
	if err := b.server.Restart(b.ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrSetup, err)
	}
	return nil
}

// startRedisServer starts the drill's own redis-server (bin, default on
// PATH) without persistence on a free loopback port.
func startRedisServer(ctx context.Context, bin string) (*redisproc.Server, error) {
	s, err := redisproc.Start(ctx, redisproc.Options{Bin: bin})
	if err != nil {
		return nil, setupError(err)
	}
	return s, nil
}

// setupError classifies an error from redisproc: a missing binary is a
// configuration error, anything else a setup failure.
func setupError(err error) error {
	switch {
	case errors.Is(err, redisproc.ErrNoBinary):
		return fmt.Errorf("%w: --redis-server: %v (install the Debian package redis-server or give its path)", ErrInvalidConfig, err)
	case err != nil:
		return fmt.Errorf("%w: %v", ErrSetup, err)
	}
	return nil
}
