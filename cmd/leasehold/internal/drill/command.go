package drill

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
)

// CommandOptions adds what the drill cannot build itself to its command.
type CommandOptions struct {
	// Metrics, when set, adds --metrics-addr, --record-metrics and
	// --record-interval: it is called with their values and returns an
	// Observer that serves the events as metrics and records them (nil when
	// no flag asks for either), and the function that stops both.
	Metrics func(MetricsOptions) (leasehold.Observer, func(), error)
	// Logger, when set, returns the logger of --log (the lockers' records)
	// at level unless the caller's flags chose another level and format;
	// default: text to stderr at level.
	Logger func(level slog.Level) *slog.Logger
}

// Command returns the `drill` subcommand. It runs a drill on the embedded
// memory store, prints one verdict line per invariant (or the JSON report
// with --json), optionally writes an SVG timeline, and returns an error
// wrapping ErrInvalidConfig for bad flags and ErrInvariantViolated when an
// invariant failed.
func Command() *cobra.Command { return NewCommand(CommandOptions{}) }

// NewCommand is Command with options.
func NewCommand(opts CommandOptions) *cobra.Command {
	c := &cmdFlags{opts: opts, worker: newWorkerCommand()}
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "Run a game day: inject faults into working replicas and check the recorded history",
		Long: `drill runs replicas of a small worker that process jobs under per-item leases and
write each job's result to a fenced register, while it injects faults one after another:
a holder paused past its TTL right before its write, a store outage, a holder that crashes
without releasing, latency above the renew timeout, replies lost after the store applied
the request, and a store restart that loses its data. A checker then decides from the
recorded history whether the invariants held and prints one verdict per invariant.
The exit status is non-zero when any invariant failed.

--workload election runs leasehold.Election on one key instead of the jobs (at most one
trusted leader at any moment, the leaders' fenced writes linearizable); --workload semaphore
holds permits of one key (at most --permits trusted holders, fences unique and increasing,
a crashed holder's permit back after its TTL).

--store memory (default) runs on the embedded store. --store redis://HOST:PORT[/DB] runs on
an existing Redis, each replica connecting through a fault proxy (the drill does not restart
it); --store redis-server starts the drill's own redis-server so it can restart it too.
--store etcd://HOST:PORT[,HOST:PORT] runs on an existing etcd cluster through a fault proxy
per endpoint; --store etcd-server starts its own single-member etcd (the etcd binary on PATH) and
restarts it (keeping its data). On etcd the TTL defaults to 2s (leases are whole seconds).
--store redis-sentinel starts a Sentinel group (a master, two replicas, three sentinels) on
loopback for --faults failover (SENTINEL FAILOVER while replicas hold and wait; not in "all").
--store postgres://USER@HOST:PORT/DB runs on an existing PostgreSQL through a fault proxy per
host, in a schema of the run's own; --store postgres-server starts the drill's own PostgreSQL,
crashes and restarts it, and for --faults failover adds a streaming standby it promotes.
--faults partition (not in "all"; root and the ip command, --store redis-server or
etcd-server) puts the drill's redis-server (or a 3-member etcd cluster) and the replicas in
network namespaces and cuts a holder's node (or its etcd member) off for 3 x TTL; without
root or ip the drill refuses it (exit status 2).
--faults evict (not in "all"; --store redis-server) freezes a holder right before its write,
makes Redis evict the locks (maxmemory with volatile-ttl under a cache's writes, which
leasehold doctor reports as redis_eviction), lets another replica take the job and thaws the
holder: its lease still looks valid, so it writes with its old fence and the register rejects it.
--processes runs each replica as a child process of this program (on Redis only): a pause
is then SIGSTOP/SIGCONT of the holder's process and a crash a SIGKILL.`,
		Example: `  leasehold drill
  leasehold drill --faults pause,outage --outage 2s --timeline drill.svg
  leasehold drill --on-store-error fail-open --fencing off   # watch the checker fail
  leasehold drill --store redis-server                       # own redis-server, every fault
  leasehold drill --store redis-sentinel --faults pause,failover  # own Sentinel group, a failover
  leasehold drill --store redis://127.0.0.1:6379/0 --faults pause,outage,crash,latency,lostreply
  leasehold drill --store redis-server --processes           # replicas as processes: SIGSTOP, SIGKILL
  leasehold drill --store redis-server --faults evict        # a lock evicted under maxmemory
  leasehold drill --store etcd-server                        # own etcd process, every fault
  leasehold drill --store postgres-server --faults pause,restart,failover  # own primary + standby
  leasehold drill --workload election --store redis-server   # leader election through every fault
  leasehold drill --workload semaphore --permits 2 --replicas 4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.run(cmd) },
	}
	cmd.AddCommand(c.worker)
	f := cmd.Flags()
	f.BoolVar(&c.cfg.Processes, "processes", false, "run each replica as a child process of this program: pause is SIGSTOP/SIGCONT, crash is SIGKILL (needs --store "+StoreRedisServer+" or redis://)")
	f.StringVar(&c.store, "store", "memory", "lock store: memory (embedded), redis://[USER:PASSWORD@]HOST:PORT[/DB] (an existing Redis, through a fault proxy; not restarted), or "+StoreRedisServer+" (the drill starts its own redis-server without persistence and restarts it), etcd://HOST:PORT[,HOST:PORT] (an existing etcd, through a fault proxy; not restarted), or "+StoreEtcdServer+" (the drill starts its own etcd from PATH and restarts it), or "+StoreRedisSentinel+" (the drill starts a master, two replicas and three sentinels, for the failover fault), postgres://USER@HOST:PORT/DB (an existing PostgreSQL, through a fault proxy; not restarted), or "+StorePostgresServer+" (the drill starts its own PostgreSQL, restarts it, and for the failover fault promotes its standby)")
	f.StringVar(&c.cfg.RedisServer, "redis-server", "redis-server", "redis-server binary for --store "+StoreRedisServer)
	f.BoolVar(&c.cfg.FailoverKill, "failover-kill", false, "the failover fault kills the master (SIGKILL) instead of sending SENTINEL FAILOVER; the killed server stays down")
	f.StringVar(&c.cfg.Register, "register", "memory", "fenced register the jobs write to: memory, redis://HOST:PORT[/DB] or postgres://… (a server the drill does not fault or restart)")
	f.IntVar(&c.cfg.Replicas, "replicas", 3, "worker replicas, each with its own Locker")
	f.IntVar(&c.cfg.Jobs, "jobs", 40, "jobs to process (the jobs workload)")
	f.StringVar((*string)(&c.cfg.Workload), "workload", string(WorkloadJobs), "what the replicas do: jobs (per-job leases, fenced writes), election (leasehold.Election on one key, the leader writes fenced) or semaphore (permits of one key, --permits)")
	f.IntVar(&c.cfg.Permits, "permits", 2, "the semaphore workload's limit: at most this many holders (less than --replicas)")
	f.DurationVar(&c.cfg.TTL, "ttl", 400*time.Millisecond, "lease TTL (on etcd: default 2s, at least 1s)")
	f.DurationVar(&c.cfg.WorkMin, "work-min", 0, "shortest simulated work per job (default TTL/2)")
	f.DurationVar(&c.cfg.WorkMax, "work-max", 0, "longest simulated work per job (default 1.25 × TTL)")
	f.StringVar(&c.onStoreErr, "on-store-error", "fail-closed", "store-failure policy on acquire: fail-closed or fail-open")
	f.StringVar(&c.onRenewFail, "on-renew-failure", "fence", "renewal-failure policy: fence or continue")
	f.StringVar(&c.fencing, "fencing", "on", "fenced register: on (reject lower fences) or off (accept every write)")
	f.StringVar(&c.faults, "faults", "all", "faults to inject, in order: comma-separated from "+faultList(knownFaults)+", or all (every fault but failover and partition), or none")
	f.DurationVar(&c.cfg.Outage, "outage", time.Second, "length of the store outage (on etcd: default 2.5 × TTL)")
	f.DurationVar(&c.cfg.Latency, "latency", 0, "latency added by the latency fault (default renew timeout + 100ms)")
	f.DurationVar(&c.cfg.Window, "window", 0, "length of the latency and lost-reply faults (default 3 × TTL)")
	f.Float64Var(&c.cfg.DropRate, "drop-rate", 0.3, "share of replies the lost-reply fault drops")
	f.DurationVar(&c.cfg.TimeLimit, "time-limit", time.Minute, "stop the workload after this long; unfinished jobs fail the run")
	f.Uint64Var(&c.cfg.Seed, "seed", 0, "random seed for job lengths and victims (0: time-based)")
	f.BoolVar(&c.asJSON, "json", false, "print the report, history included, as JSON")
	f.StringVar(&c.timeline, "timeline", "", "write an SVG timeline of holders, writes and faults to `FILE`")
	f.BoolVarP(&c.verbose, "verbose", "v", false, "print the details of every invariant")
	f.BoolVar(&c.logLocks, "log", false, "print the lockers' warnings and errors to stderr")
	f.BoolVarP(&c.quiet, "quiet", "q", false, "no progress lines on stderr (replicas starting, each fault starting and ending)")
	if opts.Metrics != nil {
		f.StringVar(&c.metrics.Addr, "metrics-addr", "", "serve Prometheus /metrics on this address while the drill runs")
		f.StringVar(&c.metrics.RecordFile, "record-metrics", "", "write timestamped text-format scrapes of the metrics to `FILE` while the drill runs (to replay through alert rules)")
		f.DurationVar(&c.metrics.RecordInterval, "record-interval", time.Second, "time between two scrapes of --record-metrics")
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	})
	return cmd
}

// cmdFlags are the drill command's flags and options.
type cmdFlags struct {
	opts                             CommandOptions
	worker                           *cobra.Command
	cfg                              Config
	metrics                          MetricsOptions
	store, faults, timeline          string
	onStoreErr, onRenewFail, fencing string
	asJSON, verbose, logLocks, quiet bool
}

// choose returns the value of flag name's setting v in m, or an error that
// lists the choices.
func choose[T any](name, v string, m map[string]T, choices string) (T, error) {
	t, ok := m[v]
	if !ok {
		return t, invalid("--%s must be %s, got %q", name, choices, v)
	}
	return t, nil
}

// config builds the drill's Config from the flags.
func (f *cmdFlags) config(cmd *cobra.Command) (Config, error) {
	cfg := f.cfg
	cfg.Store = f.store
	if cfg.kind().etcd() {
		// etcd leases are whole seconds: unless given, the TTL and the
		// outage take etcd's defaults (Config.WithDefaults).
		if !cmd.Flags().Changed("ttl") {
			cfg.TTL = 0
		}
		if !cmd.Flags().Changed("outage") {
			cfg.Outage = 0
		}
	}
	var err error
	if cfg.Faults, err = ParseFaults(f.faults); err != nil {
		return cfg, err
	}
	policies := map[string]leasehold.StorePolicy{"fail-closed": leasehold.FailClosed, "fail-open": leasehold.FailOpen}
	if cfg.OnStoreError, err = choose("on-store-error", f.onStoreErr, policies, "fail-closed or fail-open"); err != nil {
		return cfg, err
	}
	renewals := map[string]leasehold.RenewalPolicy{"fence": leasehold.RenewalFence, "continue": leasehold.RenewalContinue}
	if cfg.OnRenewFailure, err = choose("on-renew-failure", f.onRenewFail, renewals, "fence or continue"); err != nil {
		return cfg, err
	}
	if cfg.NoFencing, err = choose("fencing", f.fencing, map[string]bool{"on": false, "off": true}, "on or off"); err != nil {
		return cfg, err
	}
	if !f.quiet {
		cfg.Progress = cmd.ErrOrStderr()
	}
	if f.logLocks {
		cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
		if f.opts.Logger != nil {
			cfg.Logger = f.opts.Logger(slog.LevelWarn)
		}
	}
	if cfg.Processes {
		// The worker is this command's hidden subcommand, wherever the
		// command is mounted ("leasehold drill worker").
		sub := append(strings.Fields(cmd.CommandPath())[1:], f.worker.Name())
		if cfg.WorkerCommand, err = cfg.workerCommand(sub...); err != nil {
			return cfg, err
		}
	}
	return cfg.WithDefaults()
}

// run runs the drill of the flags and prints its report.
func (f *cmdFlags) run(cmd *cobra.Command) error {
	cfg, err := f.config(cmd)
	if err != nil {
		return err
	}
	var tf *os.File
	if f.timeline != "" { // fail before a long run, not after
		if tf, err = os.Create(f.timeline); err != nil {
			return fmt.Errorf("%w: --timeline: %v", ErrInvalidConfig, err)
		}
		defer tf.Close()
	}
	if f.opts.Metrics != nil {
		obs, stop, err := f.opts.Metrics(f.metrics)
		if err != nil {
			return err
		}
		defer stop()
		if obs != nil {
			initSeries(obs, cfg)
			cfg.Observer = obs
		}
	}
	cmd.SilenceUsage = true
	if cfg.kind().redis() {
		// go-redis logs dial failures (expected during the outage) to
		// stderr by default; route them to --log or nowhere.
		redis.SetLogger(redisLogger{cfg.Logger})
	}
	rep, err := Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	return f.print(cmd.OutOrStdout(), rep, tf)
}

// print writes the report (text or JSON) and the timeline, and fails when an
// invariant did.
func (f *cmdFlags) print(out io.Writer, rep *Report, tf *os.File) error {
	var err error
	if f.asJSON {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteText(out, f.verbose)
	}
	if err != nil {
		return err
	}
	if tf != nil {
		if err := rep.WriteTimeline(tf); err != nil {
			return fmt.Errorf("drill: write timeline: %w", err)
		}
		if err := tf.Close(); err != nil {
			return fmt.Errorf("drill: write timeline: %w", err)
		}
		if !f.asJSON {
			fmt.Fprintf(out, "timeline: %s\n", f.timeline)
		}
	}
	if !rep.Passed {
		var names []string
		for _, iv := range rep.Failed() {
			names = append(names, iv.Name)
		}
		return fmt.Errorf("%w: %s", ErrInvariantViolated, strings.Join(names, "; "))
	}
	return nil
}

// newWorkerCommand is the hidden `drill worker` subcommand: one worker
// process of `drill --processes`. It reads its settings (the Redis password
// included) from stdin, never from flags, and talks to the drill over its
// stdin and stdout.
func newWorkerCommand() *cobra.Command {
	return &cobra.Command{
		Use:           "worker",
		Short:         "One worker process of drill --processes (started by the drill; not for direct use)",
		Hidden:        true,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWorker(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
}

// redisLogger sends go-redis's log lines to the drill's logger at debug
// level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
