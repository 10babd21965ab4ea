package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/pgproc"
	"github.com/leasehold/leasehold/pgstore"
)

// StorePostgresServer is the Config.Store value that makes the drill start
// its own PostgreSQL (internal/pgproc) on a free loopback port, so the
// restart fault can crash and restart it; with the failover fault it also
// starts a streaming standby and promotes it.
const StorePostgresServer = "postgres-server"

// pgBackend runs the drill on PostgreSQL, in a schema of the run's own.
// Every replica process has its own pgx pool and pgstore.Store that reach
// each server through a fault proxy; the observer has a direct pool that
// no fault reaches. Clients name every server with
// target_session_attrs=read-write, so a new connection goes to whichever
// accepts writes: after a promotion, the former standby.
type pgBackend struct {
	proxied
	// primary and standby are nil unless the drill started them; the
	// standby only for the failover fault.
	primary, standby *pgproc.Server
	replica          *pgxpool.Config // the replicas' pool: through the proxies
	direct           *pgxpool.Pool
	obs              *pgstore.Store
	opts             pgstore.Options
	ctx              context.Context // for restarts
}

func newPgBackend(ctx context.Context, cfg Config) (_ *pgBackend, err error) {
	b := &pgBackend{proxied: proxied{cfg: cfg}, ctx: context.WithoutCancel(ctx)}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	base, err := b.baseConfig(ctx)
	if err != nil {
		return nil, err
	}
	direct := base.Copy()
	direct.ConnConfig.ConnectTimeout = 2 * time.Second
	if b.direct, err = pgxpool.NewWithConfig(ctx, direct); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	b.atClose(b.direct.Close)
	b.opts.Schema = "leasehold_drill_" + runID()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	schema := pgx.Identifier{b.opts.Schema}.Sanitize()
	if _, err := b.direct.Exec(pctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, fmt.Errorf("%w: PostgreSQL at %s: create the run's schema: %v", ErrSetup, pgHosts(base.ConnConfig), err)
	}
	if b.primary == nil { // not the drill's own: drop the schema (best effort)
		b.atClose(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _ = b.direct.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		})
	}
	b.opts.Migrate = pgstore.MigrateCreate
	if b.obs, err = pgstore.New(pctx, b.direct, b.opts); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	b.atClose(func() { _ = b.obs.Close() })
	b.opts.Migrate = pgstore.MigrateNever
	b.opts.ReconnectDelay = cfg.TTL // a replica's LISTEN connection is back soon after a fault
	return b, b.proxyConfig(base)
}

// baseConfig starts the drill's own servers, or parses Config.Store, and
// returns the pool configuration that reaches them directly.
func (b *pgBackend) baseConfig(ctx context.Context) (*pgxpool.Config, error) {
	if b.cfg.kind() != storeOwnPostgres {
		cfg, opts, err := storeurl.PostgresConfig(b.cfg.Store, os.Getenv)
		if err != nil {
			return nil, fmt.Errorf("%w: --store: %v", ErrInvalidConfig, err)
		}
		b.opts = opts
		return cfg, nil
	}
	var err error
	if b.primary, err = pgproc.Start(ctx, pgproc.Options{}); err != nil {
		return nil, startError(err, pgproc.ErrNotInstalled, StorePostgresServer)
	}
	b.atClose(b.primary.Close)
	hosts := []string{b.primary.Addr}
	if slices.Contains(b.cfg.Faults, FaultFailover) {
		if b.standby, err = b.primary.StartStandby(ctx); err != nil {
			return nil, startError(err, pgproc.ErrNotInstalled, StorePostgresServer)
		}
		b.atClose(b.standby.Close)
		hosts = append(hosts, b.standby.Addr)
	}
	dsn := fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&target_session_attrs=read-write",
		pgproc.Superuser, strings.Join(hosts, ","))
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	return cfg, nil
}

// startError classifies an error from starting the drill's own store
// (Config.Store value store): its program missing (missing) is a
// configuration error, anything else a setup failure.
func startError(err, missing error, store string) error {
	if errors.Is(err, missing) {
		return fmt.Errorf("%w: --store %s: %v", ErrInvalidConfig, store, err)
	}
	return fmt.Errorf("%w: %v", ErrSetup, err)
}

// proxyConfig starts a fault proxy in front of every server base names and
// sets the replicas' pool configuration to reach them through it.
func (b *pgBackend) proxyConfig(base *pgxpool.Config) error {
	b.replica = base.Copy()
	cc := b.replica.ConnConfig
	// Timeouts: a fault shows up as an error, and a replica connects again
	// soon after.
	cc.ConnectTimeout = max(time.Second, b.cfg.clientTimeout())
	b.replica.MaxConns = 8
	route := map[string]string{}
	for _, t := range pgTargets(cc) {
		if strings.HasPrefix(*t.host, "/") {
			return fmt.Errorf("%w: --store %s: the drill reaches PostgreSQL over TCP (host:port), not a unix socket", ErrInvalidConfig, storeurl.Describe(b.cfg.Store))
		}
		addr := net.JoinHostPort(*t.host, strconv.Itoa(int(*t.port)))
		if route[addr] == "" {
			x, err := b.startProxy(addr)
			if err != nil {
				return err
			}
			route[addr] = x.Addr()
		}
		host, port, _ := net.SplitHostPort(route[addr])
		p, _ := strconv.Atoi(port)
		*t.host, *t.port = host, uint16(p)
	}
	return nil
}

// pgTarget is one server address a pgx configuration dials.
type pgTarget struct {
	host *string
	port *uint16
}

// pgTargets returns the addresses cc dials: its host and every fallback
// (the other hosts, and each host again without TLS under sslmode=prefer).
func pgTargets(cc *pgx.ConnConfig) []pgTarget {
	out := []pgTarget{{&cc.Host, &cc.Port}}
	for _, f := range cc.Fallbacks {
		out = append(out, pgTarget{&f.Host, &f.Port})
	}
	return out
}

// pgHosts names the servers of cc, for messages.
func pgHosts(cc *pgx.ConnConfig) string {
	var hosts []string
	for _, t := range pgTargets(cc) {
		if h := net.JoinHostPort(*t.host, strconv.Itoa(int(*t.port))); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",")
}

func (b *pgBackend) open(int) (driver.Store, func(), error) {
	pool, err := pgxpool.NewWithConfig(b.ctx, b.replica.Copy())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	s, err := pgstore.New(b.ctx, pool, b.opts)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, processEnd(pool.Close, s), nil
}

func (b *pgBackend) observer() inspectStore        { return b.obs }
func (b *pgBackend) observeTimeout() time.Duration { return 300 * time.Millisecond }
func (b *pgBackend) expiryBound() time.Duration    { return b.cfg.TTL }

// restart crashes the drill's primary (pg_ctl stop -m immediate: every
// connection dropped, mid-transaction where one was running) and starts it
// again: crash recovery empties pgstore's UNLOGGED lock and queue tables,
// so the locks are lost (mark); fences must go on rising.
func (b *pgBackend) restart(mark func()) error {
	if b.primary == nil {
		return fmt.Errorf("%w: the drill did not start this PostgreSQL, so it does not restart it (use --store %s)", errRestartSkipped, StorePostgresServer)
	}
	if err := b.primary.Crash(b.ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrSetup, err)
	}
	mark()
	if err := b.primary.Restart(b.ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrSetup, err)
	}
	return nil
}

func (b *pgBackend) restartNote() string {
	return "PostgreSQL crashed (pg_ctl stop -m immediate: connections dropped mid-transaction) and restarted: " +
		"crash recovery emptied the UNLOGGED lock and queue tables; fences rest on the database clock and the logged floor counter"
}

// failover crashes the primary, which stays down, and promotes the standby;
// mark is called as the primary goes down. Clients find the new primary
// through target_session_attrs=read-write.
func (b *pgBackend) failover(ctx context.Context, mark func()) (string, error) {
	if b.standby == nil {
		return "", fmt.Errorf("%w: no standby to promote (use --store %s)", errRestartSkipped, StorePostgresServer)
	}
	old, nw := b.primary, b.standby
	start := time.Now()
	mark()
	if err := old.Crash(ctx); err != nil {
		return "", err
	}
	crashed := time.Since(start)
	if err := nw.Promote(ctx); err != nil {
		return "", err
	}
	b.primary, b.standby = nw, nil
	old.Close()
	return fmt.Sprintf("primary %s crashed (pg_ctl stop -m immediate, stays down) in %v; standby %s promoted (pg_ctl promote) and taking writes %v after the crash began",
		old.Addr, crashed.Round(time.Millisecond), nw.Addr, time.Since(start).Round(time.Millisecond)), nil
}
