package drill

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
)

// ErrInvalidConfig is returned by Run and Command for a configuration that
// cannot run; the message names the setting to fix.
var ErrInvalidConfig = errors.New("drill: invalid configuration")

// ErrSetup is returned by Run when the drill could not start: the store is
// unreachable or its own redis-server did not come up.
var ErrSetup = errors.New("drill: setup failed")

// ErrInvariantViolated is returned by Command (and matched by a non-zero exit)
// when at least one invariant failed.
var ErrInvariantViolated = errors.New("drill: invariant violated")

// Fault is one kind of injected fault.
type Fault string

// The faults, in the order a drill injects them.
const (
	// FaultPause freezes a holder between its last ownership check and its
	// write, with every store call of its process blocked, until another
	// replica has taken the job over and written; then the holder writes.
	FaultPause Fault = "pause"
	// FaultOutage takes the store down for Config.Outage.
	FaultOutage Fault = "outage"
	// FaultCrash kills a holder mid-job: it never releases and its process
	// sends nothing more; it restarts as a new process after 2 × TTL.
	FaultCrash Fault = "crash"
	// FaultLatency adds Config.Latency (above the renew timeout) to every
	// store call for Config.Window.
	FaultLatency Fault = "latency"
	// FaultLostReply drops the reply of acquire, renew and release calls the
	// store applied, with probability Config.DropRate, for Config.Window.
	FaultLostReply Fault = "lostreply"
	// FaultRestart restarts the store, losing every lock and fence counter.
	FaultRestart Fault = "restart"
	// FaultFailover asks Sentinel for a failover (SENTINEL FAILOVER) while
	// replicas hold and wait: a replica becomes the master. It needs
	// StoreRedisSentinel, or StorePostgresServer (the primary crashes and
	// its streaming standby is promoted), and is not part of AllFaults.
	FaultFailover Fault = "failover"
	// FaultPartition cuts a holder's network namespace off the store (its
	// packets dropped both ways) for 3 × TTL, then heals it. It needs
	// StoreRedisServer, root and the `ip` command, and is not part of
	// AllFaults.
	FaultPartition Fault = "partition"
	// FaultEvict freezes a holder right before its write, makes the
	// drill's own redis-server evict the locks under memory pressure
	// (maxmemory with volatile-ttl and a cache's writes), lets another
	// replica take the job, then thaws the holder, whose lease still looks
	// valid. It needs StoreRedisServer and is not part of AllFaults.
	FaultEvict Fault = "evict"
)

// AllFaults lists every fault that every store can take, in injection
// order: what "all" means. The topology faults (FaultFailover) are named
// on their own.
var AllFaults = []Fault{FaultPause, FaultOutage, FaultCrash, FaultLatency, FaultLostReply, FaultRestart}

// knownFaults is every fault in injection order.
var knownFaults = append(slices.Clone(AllFaults), FaultFailover, FaultPartition, FaultEvict)

// ParseFaults parses a comma-separated fault list; "all" means AllFaults and
// "none" or "" means no faults. Order and duplicates are normalized to the
// order of AllFaults.
func ParseFaults(s string) ([]Fault, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "all":
		return slices.Clone(AllFaults), nil
	case "", "none":
		return nil, nil
	}
	want := map[Fault]bool{}
	for _, part := range strings.Split(s, ",") {
		f := Fault(strings.TrimSpace(part))
		if !slices.Contains(knownFaults, f) {
			return nil, invalid("unknown fault %q in --faults (choose from %s, all, none)", f, faultList(knownFaults))
		}
		want[f] = true
	}
	var out []Fault
	for _, f := range knownFaults {
		if want[f] {
			out = append(out, f)
		}
	}
	return out, nil
}

// Workload is what the replicas do under their leases.
type Workload string

// The workloads.
const (
	// WorkloadJobs: replicas take jobs under per-job leases and write each
	// job's result to a fenced register (the default).
	WorkloadJobs Workload = "jobs"
	// WorkloadElection: replicas campaign for leadership of one key
	// (leasehold.Election); each leader writes to a fenced register while it
	// trusts its leadership.
	WorkloadElection Workload = "election"
	// WorkloadSemaphore: replicas take permits of one semaphore key
	// (Locker.Semaphore, Config.Permits) and hold them for a while.
	WorkloadSemaphore Workload = "semaphore"
)

// Config configures a drill. The zero value is valid and means the
// documented defaults (fill them with WithDefaults).
type Config struct {
	// Store is the lock store: "" or "memory" (the embedded memory store,
	// default), "redis://[USER:PASSWORD@]HOST:PORT[/DB]" (or rediss://) for
	// an existing Redis, reached through a fault proxy; the drill does not
	// restart a Redis it did not start), or StoreRedisServer ("redis-server")
	// to have the drill start its own redis-server on a free loopback port,
	// without persistence, and restart it for the restart fault.
	// "etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][?prefix=P]" drills an
	// existing etcd cluster through a fault proxy per endpoint (not
	// restarted); StoreEtcdServer ("etcd-server") starts a single-member
	// etcd (the etcd binary from PATH) and restarts it (keeping its data)
	// for the restart fault. On etcd the TTL defaults to 2 s and must be at
	// least 1 s: etcd leases are whole seconds. StoreRedisSentinel
	// ("redis-sentinel") starts a Sentinel group (a master, two replicas,
	// three sentinels, redis-server from RedisServer) for the failover
	// fault; the replicas use go-redis's failover client, through a fault
	// proxy per server. "postgres://…" (or postgresql://, parsed as
	// storeurl.Open does) drills an existing PostgreSQL through a fault proxy
	// per host, in a schema of the run's own (dropped at the end; the user
	// needs CREATE on the database); StorePostgresServer ("postgres-server")
	// starts the drill's own PostgreSQL, crashes and restarts it for the
	// restart fault, and with the failover fault adds a streaming standby
	// that it promotes.
	Store string
	// FailoverKill makes the failover fault kill the master (SIGKILL)
	// instead of asking Sentinel for a failover; the killed server stays
	// down for the rest of the run.
	FailoverKill bool
	// RedisServer is the redis-server binary for StoreRedisServer. Default
	// "redis-server" on PATH.
	RedisServer string
	// Processes runs every replica as a child process (WorkerCommand)
	// instead of a group of goroutines: a pause is SIGSTOP/SIGCONT and a
	// crash SIGKILL. It needs a store every process reaches: Redis
	// (StoreRedisServer or a redis:// URL), not the memory store.
	Processes bool
	// WorkerCommand starts one worker process: the program and its
	// arguments. Default: this executable with the arguments "drill worker"
	// (the hidden subcommand of NewCommand). The worker reads its settings
	// from stdin and talks to the drill over its stdin and stdout.
	WorkerCommand []string
	// Workload is what the replicas do: WorkloadJobs (default),
	// WorkloadElection or WorkloadSemaphore. The election and semaphore
	// workloads run in-process only (not with Processes).
	Workload Workload
	// Permits is the semaphore workload's limit. Default 2.
	Permits int
	// Replicas is the number of worker processes, each with its own Locker
	// over the same store. Default 3.
	Replicas int
	// Jobs is the number of jobs. Default 40; at least len(Faults)+2, so
	// every fault lands while jobs are still in progress.
	Jobs int
	// TTL of every lease. Default 400 ms; on etcd 2 s (at least 1 s).
	TTL time.Duration
	// WorkMin and WorkMax bound each job's simulated work, drawn uniformly.
	// Default 200 ms and 500 ms: most jobs outlive a renew interval.
	WorkMin, WorkMax time.Duration
	// OnStoreError is the lockers' store-failure policy. Default FailClosed.
	OnStoreError leasehold.StorePolicy
	// OnRenewFailure is the lockers' renewal-failure policy. Default
	// RenewalFence.
	OnRenewFailure leasehold.RenewalPolicy
	// NoFencing makes the register accept every write (fencing off).
	NoFencing bool
	// Faults to inject, one after another. nil means none; use AllFaults
	// for all.
	Faults []Fault
	// Outage is the length of the store outage. Default 1 s; on etcd
	// 2.5 × TTL.
	Outage time.Duration
	// Latency added by the latency fault. Default the renew timeout + 100 ms.
	Latency time.Duration
	// Window is how long the latency and lost-reply faults last. Default
	// 3 × TTL.
	Window time.Duration
	// DropRate is the probability that the lost-reply fault drops one reply.
	// Default 0.3.
	DropRate float64
	// TimeLimit bounds the workload; jobs not done by then are reported.
	// Default 60 s.
	TimeLimit time.Duration
	// Seed makes job durations and victim choices reproducible; 0 means
	// time-based.
	Seed uint64
	// Register is the fenced register the jobs write to: "" or "memory" (the
	// default, in the drill), "redis://HOST:PORT[/DB]" (redisfence.NewRedis, keys
	// under a prefix of this run) or "postgres://…" (pgfence.NewTable on a
	// table of this run). Give a server the drill does not restart: the
	// register is the storage behind the write boundary, and no fault is
	// injected into it. Needs fencing on.
	Register string
	// Logger receives the lockers' log records. Default: discarded.
	Logger *slog.Logger `json:"-"`
	// Progress, when set, receives a line as the replicas start, as each
	// fault starts and ends (with what the replicas have done so far), and
	// as the history is checked: `leasehold drill` writes it to stderr.
	Progress io.Writer `json:"-"`
	// brokenTrust is the broken variant of the election and semaphore
	// workloads, for the tests: a holder keeps trusting its term after its
	// lease ended, so the checker must fail the run.
	brokenTrust bool
	// Observer, when set, also receives every event of the replicas' lockers
	// (named "replica-N") and of the fenced register, e.g. a Prometheus
	// adapter behind `leasehold drill --metrics-addr`.
	Observer leasehold.Observer `json:"-"`
}

// WithDefaults returns c with zero fields set to their defaults and checks
// it; the error wraps ErrInvalidConfig and names the field to fix.
func (c Config) WithDefaults() (Config, error) {
	if err := c.defaults(); err != nil {
		return c, err
	}
	for _, check := range []func() error{c.checkRanges, c.checkStore, c.checkProcesses} {
		if err := check(); err != nil {
			return c, err
		}
	}
	if c.Latency == 0 {
		c.Latency = c.renewTimeout() + 100*time.Millisecond
	}
	if c.Latency < 0 || c.Latency > time.Minute {
		return c, invalid("latency must be between 0 and 1m, got %v", c.Latency)
	}
	if err := c.checkSentinel(); err != nil {
		return c, err
	}
	return c, c.checkPartition()
}

// invalid returns an error wrapping ErrInvalidConfig.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// defaults fills the zero fields but Latency (it needs the TTL checked).
func (c *Config) defaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.Jobs == 0 {
		c.Jobs = 40
	}
	if err := c.defaultWorkload(); err != nil {
		return err
	}
	if c.kind().etcd() {
		def(&c.TTL, etcdDefaultTTL)
		def(&c.Outage, c.TTL*5/2) // as 1 s is to the default 400 ms TTL
	}
	def(&c.TTL, 400*time.Millisecond)
	def(&c.WorkMin, c.TTL/2)
	def(&c.WorkMax, c.TTL*5/4)
	def(&c.Outage, time.Second)
	def(&c.Window, 3*c.TTL)
	def(&c.TimeLimit, time.Minute)
	if c.DropRate == 0 {
		c.DropRate = 0.3
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// checkRanges checks the counts, the faults and (checkTimes) the durations.
func (c Config) checkRanges() error {
	switch {
	case c.Replicas < 2 || c.Replicas > 64:
		return invalid("replicas must be between 2 and 64, got %d", c.Replicas)
	case c.Jobs < 1 || c.Jobs > 10000:
		return invalid("jobs must be between 1 and 10000, got %d", c.Jobs)
	case c.Workload == WorkloadJobs && c.Jobs < len(c.Faults)+2:
		return invalid("jobs (%d) must be at least the number of faults + 2 (%d) so every fault lands mid-run",
			c.Jobs, len(c.Faults)+2)
	}
	for _, f := range c.Faults {
		if !slices.Contains(knownFaults, f) {
			return invalid("unknown fault %q", f)
		}
	}
	return c.checkTimes()
}

// checkTimes checks the durations and the drop rate.
func (c Config) checkTimes() error {
	switch {
	case c.TTL < 50*time.Millisecond || c.TTL > time.Minute:
		return invalid("ttl must be between 50ms and 1m, got %v", c.TTL)
	case c.WorkMin <= 0 || c.WorkMax < c.WorkMin:
		return invalid("work must satisfy 0 < work-min <= work-max, got %v and %v", c.WorkMin, c.WorkMax)
	case c.WorkMax > 10*c.TTL:
		return invalid("work-max (%v) must be at most 10 × ttl (%v)", c.WorkMax, 10*c.TTL)
	case c.Outage < 0 || c.Outage > time.Minute:
		return invalid("outage must be between 0 and 1m, got %v", c.Outage)
	case c.Window <= 0 || c.Window > time.Minute:
		return invalid("window must be between 0 and 1m, got %v", c.Window)
	case c.DropRate < 0 || c.DropRate > 1:
		return invalid("drop rate must be between 0 and 1, got %v", c.DropRate)
	case c.TimeLimit <= 0:
		return invalid("time limit must be > 0, got %v", c.TimeLimit)
	}
	return nil
}

// checkStoreURL checks Config.Store without connecting; the error wraps
// ErrInvalidConfig and never contains a password.
func (c Config) checkStoreURL() error {
	switch c.kind() {
	case storeRedis:
		_, err := redisOptions(c.Store)
		return err
	case storeEtcd:
		_, _, err := etcdEndpoints(c.Store)
		return err
	case storePostgres:
		if _, _, err := storeurl.PostgresConfig(c.Store, nil); err != nil {
			return invalid("--store: %v", err)
		}
	case storeUnknown:
		return invalid("store must be memory, %s, redis://HOST:PORT[/DB], %s, etcd://HOST:PORT[,HOST:PORT], %s or "+
			"postgres://USER@HOST:PORT/DB, got %q", StoreRedisServer, StoreEtcdServer, StorePostgresServer,
			storeurl.Describe(c.Store))
	}
	return nil
}

// checkStore checks the store and the register.
func (c Config) checkStore() error {
	switch err := c.checkStoreURL(); {
	case err != nil:
		return err
	case c.kind().etcd() && c.TTL < etcdMinTTL:
		return invalid("ttl must be at least %v on etcd (its leases are whole seconds, 1 s at the least), got %v; "+
			"drop --ttl for the default %v", etcdMinTTL, c.TTL, etcdDefaultTTL)
	case c.NoFencing && c.Register != "" && c.Register != "memory":
		return invalid("--fencing off uses the drill's own unfenced register; drop --register %s",
			storeurl.Describe(c.Register))
	}
	return checkRegister(c.Register)
}

// checkProcesses checks what worker processes need.
func (c Config) checkProcesses() error {
	switch {
	case !c.Processes:
		return nil
	case c.kind().etcd() || c.kind().postgres():
		return invalid("--processes runs on Redis only: its worker processes speak to Redis; drop --processes "+
			"with --store %s (pause and crash then stop the replica inside the drill)", storeurl.Describe(c.Store))
	case !c.kind().redis():
		return invalid("--processes needs a store every worker process can reach: use --store %s or "+
			"--store redis://HOST:PORT[/DB] (the memory store lives inside one process)", StoreRedisServer)
	case !processesSupported:
		return invalid("--processes needs SIGSTOP and SIGCONT, which this operating system does not have")
	}
	return nil
}

// checkSentinel checks what needs the drill's own Sentinel group.
func (c Config) checkSentinel() error {
	switch {
	case slices.Contains(c.Faults, FaultFailover) && c.kind() != storeOwnSentinel && c.kind() != storeOwnPostgres:
		return invalid("the failover fault needs replicas to fail over to: use --store %s (the drill starts a "+
			"master, two replicas and three sentinels) or --store %s (a primary and a streaming standby)",
			StoreRedisSentinel, StorePostgresServer)
	case slices.Contains(c.Faults, FaultEvict) && c.kind() != storeOwnRedis:
		return invalid("the evict fault changes maxmemory on the drill's own Redis: use --store %s", StoreRedisServer)
	case c.Processes && c.kind() == storeOwnSentinel:
		return invalid("--processes does not run on --store %s yet: its worker processes reach one Redis "+
			"address; drop --processes", StoreRedisSentinel)
	}
	return nil
}

// defaultWorkload fills and checks Workload and Permits (Replicas is set).
func (c *Config) defaultWorkload() error {
	if c.Workload == "" {
		c.Workload = WorkloadJobs
	}
	if c.Permits == 0 {
		c.Permits = 2
	}
	switch {
	case c.Workload == WorkloadJobs:
		return nil
	case c.Workload != WorkloadElection && c.Workload != WorkloadSemaphore:
		return invalid("workload must be %s, %s or %s, got %q", WorkloadJobs, WorkloadElection, WorkloadSemaphore,
			c.Workload)
	case c.Workload == WorkloadSemaphore && (c.Permits < 1 || c.Permits >= c.Replicas):
		return invalid("permits must be between 1 and replicas - 1 (%d), so that replicas contend, got %d",
			c.Replicas-1, c.Permits)
	case c.Processes:
		return invalid("--processes runs the jobs workload only; drop it with --workload %s", c.Workload)
	}
	c.Jobs = 1 // one key: the election's or the semaphore's
	return nil
}

// storeKind is the kind of lock store Config.Store names: the one place
// that reads the string.
type storeKind int

const (
	storeMemory      storeKind = iota // "" or "memory": the embedded store
	storeOwnRedis                     // StoreRedisServer: a redis-server the drill starts and restarts
	storeRedis                        // redis:// or rediss://: an existing Redis
	storeOwnEtcd                      // StoreEtcdServer: an etcd the drill starts and restarts
	storeEtcd                         // etcd://: an existing etcd cluster
	storeOwnSentinel                  // StoreRedisSentinel: a Sentinel group the drill starts
	storeOwnPostgres                  // StorePostgresServer: a PostgreSQL the drill starts
	storePostgres                     // postgres:// or postgresql://: an existing PostgreSQL
	storeUnknown
)

// kind classifies c.Store.
func (c Config) kind() storeKind {
	switch s := c.Store; {
	case s == "" || s == "memory":
		return storeMemory
	case s == StoreRedisServer:
		return storeOwnRedis
	case s == StoreRedisSentinel:
		return storeOwnSentinel
	case strings.HasPrefix(s, "redis://") || strings.HasPrefix(s, "rediss://"):
		return storeRedis
	case s == StoreEtcdServer:
		return storeOwnEtcd
	case strings.HasPrefix(s, "etcd://"):
		return storeEtcd
	case s == StorePostgresServer:
		return storeOwnPostgres
	case strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://"):
		return storePostgres
	}
	return storeUnknown
}

func (k storeKind) redis() bool {
	return k == storeOwnRedis || k == storeRedis || k == storeOwnSentinel
}
func (k storeKind) etcd() bool     { return k == storeOwnEtcd || k == storeEtcd }
func (k storeKind) postgres() bool { return k == storeOwnPostgres || k == storePostgres }

// viaProxy reports whether the replicas reach the store through a fault
// proxy (every store but memory).
func (k storeKind) viaProxy() bool { return k.redis() || k.etcd() || k.postgres() }

// storeLabel names the store for the report, without a password.
func (c Config) storeLabel() string {
	switch c.kind() {
	case storeOwnEtcd:
		if slices.Contains(c.Faults, FaultPartition) {
			return "etcd (own 3-member cluster, one member per network namespace, each replica on one member)"
		}
		return "etcd (own etcd process) via fault proxy"
	case storeEtcd:
		if e, _, err := etcdEndpoints(c.Store); err == nil {
			return "etcd " + strings.Join(e.Endpoints, ",") + " via fault proxy"
		}
		return "etcd"
	case storeOwnRedis:
		if slices.Contains(c.Faults, FaultPartition) {
			return "redis (own redis-server in a network namespace, each replica on its own node)"
		}
		return "redis (own redis-server) via fault proxy"
	case storeOwnSentinel:
		return "redis sentinel (own master, 2 replicas, 3 sentinels) via a fault proxy per server"
	case storeOwnPostgres:
		if slices.Contains(c.Faults, FaultFailover) {
			return "postgres (own primary and streaming standby) via a fault proxy per server"
		}
		return "postgres (own server) via fault proxy"
	case storePostgres:
		if cfg, _, err := storeurl.PostgresConfig(c.Store, nil); err == nil {
			return "postgres " + pgHosts(cfg.ConnConfig) + "/" + cfg.ConnConfig.Database + " via fault proxy"
		}
		return "postgres"
	case storeRedis:
		if o, err := redisOptions(c.Store); err == nil {
			return fmt.Sprintf("redis %s/%d via fault proxy", o.Addr, o.DB)
		}
		return "redis"
	}
	return "memory"
}

// renewTimeout is the lockers' renew timeout: the leasehold default for TTL.
func (c Config) renewTimeout() time.Duration {
	return min(leasehold.DefaultRenewTimeout, c.TTL/2)
}

func (c Config) lockerOptions(name string, obs leasehold.Observer) leasehold.Options {
	return leasehold.Options{
		Name:           name,
		TTL:            c.TTL,
		OnStoreError:   c.OnStoreError,
		OnRenewFailure: c.OnRenewFailure,
		ReleaseTimeout: c.TTL,
		WaitCap:        c.TTL / 4,
		Logger:         c.Logger,
		Observer:       obs,
	}
}
