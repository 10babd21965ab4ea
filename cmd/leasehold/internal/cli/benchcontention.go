package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/contention"
)

// contentionOpts are the flags of 'bench --contention'.
type contentionOpts struct {
	on          bool
	processes   bool
	replicas    int
	keys        int
	lockers     int
	hold, cell  time.Duration
	ttl         time.Duration
	passes      int
	takeovers   int
	redis       string
	etcd        string
	etcdMetrics string
	postgres    string
	variants    []string
}

func (o *contentionOpts) register(f *pflag.FlagSet) {
	f.BoolVar(&o.on, "contention", false, "measure one key contended by --replicas processes instead (see below)")
	f.BoolVar(&o.processes, "processes", true, "--contention: each replica is its own process (the only mode)")
	f.IntVar(&o.replicas, "replicas", 8, "--contention: replica processes, each with its own Locker and store client")
	f.IntVar(&o.keys, "keys", 1, "--contention: keys of a cell; each Locker takes them in turn (round-robin)")
	f.IntVar(&o.lockers, "lockers", 1, "--contention: Lockers per replica process, each with its own store client (fairness is over all of them)")
	f.DurationVar(&o.hold, "hold", time.Millisecond, "--contention: critical section")
	f.DurationVar(&o.cell, "cell", 3*time.Second, "--contention: length of one contention cell")
	f.DurationVar(&o.ttl, "ttl", time.Second, "--contention: lease TTL (the takeover cells wait for it)")
	f.IntVar(&o.passes, "passes", 3, "--contention: passes over every store and variant")
	f.IntVar(&o.takeovers, "takeovers", 5, "--contention: kill -9 takeovers per cell (0: none)")
	f.StringVar(&o.redis, "redis", "", "--contention: Redis URL (replicas count requests on the client, the server counts pub/sub commands)")
	f.StringVar(&o.etcd, "etcd", "", "--contention: etcd URL")
	f.StringVar(&o.etcdMetrics, "etcd-metrics", "", "--contention: the etcd server's /metrics URL, to count requests")
	f.StringVar(&o.postgres, "postgres", "", "--contention: PostgreSQL URL (a server with pg_stat_statements preloaded, to count statements)")
	f.StringArrayVar(&o.variants, "variant", nil, "--contention: NAME[@STORE]=COMMAND of a replica build to compare, on every store or only on STORE (redis, etcd, postgres; repeatable); default: this binary as \"current\"")
}

func (o *contentionOpts) check() error {
	switch {
	case !o.processes:
		return usage("--contention runs each replica as a process; --processes=false is not implemented")
	case o.replicas < 2 || o.replicas > 64:
		return usage("--replicas must be between 2 and 64, got %d", o.replicas)
	case o.keys < 1 || o.keys > 1000 || o.lockers < 1 || o.lockers > 100:
		return usage("--keys must be between 1 and 1000 and --lockers between 1 and 100")
	case o.hold < 0 || o.cell <= 0 || o.ttl <= 0:
		return usage("--hold must be >= 0, --cell and --ttl > 0")
	case o.passes < 1 || o.takeovers < 0:
		return usage("--passes must be >= 1 and --takeovers >= 0")
	case o.redis == "" && o.etcd == "" && o.postgres == "":
		return usage("--contention needs at least one of --redis, --etcd, --postgres")
	}
	return nil
}

func (o *contentionOpts) variantList() ([]contention.Variant, error) {
	var vs []contention.Variant
	for _, s := range o.variants {
		name, command, ok := strings.Cut(s, "=")
		if !ok || name == "" || strings.TrimSpace(command) == "" {
			return nil, usage("--variant %q: want NAME=COMMAND", s)
		}
		name, only, _ := strings.Cut(name, "@")
		vs = append(vs, contention.Variant{Name: name, Only: only, Argv: strings.Fields(command)})
	}
	if len(vs) == 0 {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		vs = append(vs, contention.Variant{Name: "current", Argv: []string{self, "bench-child"}})
	}
	return vs, nil
}

func (o *contentionOpts) targets(ctx context.Context) ([]contention.Target, func(), error) {
	var (
		ts      []contention.Target
		closers []func()
	)
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	if o.redis != "" {
		count, closeFn, err := contention.RedisPubSubCounter(o.redis)
		if err != nil {
			return nil, nil, usage("--redis: %v", err)
		}
		closers = append(closers, closeFn)
		stats, closeStats, err := contention.RedisServerStats(o.redis)
		if err != nil {
			closeFn()
			return nil, nil, usage("--redis: %v", err)
		}
		closers = append(closers, closeStats)
		ts = append(ts, contention.Target{Name: "redis", URL: o.redis, Count: count, Server: stats})
	}
	if o.etcd != "" {
		t := contention.Target{Name: "etcd", URL: o.etcd}
		if o.etcdMetrics != "" {
			t.Count = contention.EtcdCounter(o.etcdMetrics)
		}
		ts = append(ts, t)
	}
	if o.postgres != "" {
		count, closeFn, err := contention.PostgresCounter(ctx, o.postgres)
		if err != nil {
			closeAll()
			return nil, nil, Exit(ExitUnavailable, "bench --contention: %v", err)
		}
		closers = append(closers, closeFn)
		ts = append(ts, contention.Target{Name: "postgres", URL: o.postgres, Count: count, CountOverhead: 1})
	}
	return ts, closeAll, nil
}

func (a *App) benchContention(ctx context.Context, o *contentionOpts) error {
	if err := o.check(); err != nil {
		return err
	}
	vs, err := o.variantList()
	if err != nil {
		return err
	}
	ts, closeTargets, err := o.targets(ctx)
	if err != nil {
		return err
	}
	defer closeTargets()
	cfg := contention.Config{Variants: vs, Targets: ts, Replicas: o.replicas, Keys: o.keys, Lockers: o.lockers, Hold: o.hold, Cell: o.cell,
		TTL: o.ttl, Passes: o.passes, Takeovers: o.takeovers, Progress: a.Stderr}
	cells, err := contention.Run(ctx, cfg)
	if a.json {
		if jerr := writeJSON(a.Stdout, cells); jerr != nil {
			return jerr
		}
	} else {
		printContention(a.Stdout, cfg, cells)
	}
	if err != nil {
		return Exit(ExitFailure, "bench --contention: %v", err)
	}
	return nil
}

// printContention prints, per store and variant, the range over passes of
// each measure.
func printContention(w io.Writer, cfg contention.Config, cells []contention.Cell) {
	lockers, keys := max(cfg.Lockers, 1), max(cfg.Keys, 1)
	fmt.Fprintf(w, "%d replica processes × %d Lockers (P = %d), %d key(s), hold %v, %v cells, TTL %v, %d passes (ranges over passes)\n",
		cfg.Replicas, lockers, cfg.Replicas*lockers, keys, cfg.Hold, cfg.Cell, cfg.TTL, cfg.Passes)
	fmt.Fprintf(w, "server cmds/acq: commands the server ran (inside scripts too), server CPU: used_cpu_sys+user per 1000 acquisitions\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "store\tvariant\tacquisitions\treq/acq\tserver cmds/acq\tserver CPU ms/1000 acq\tmin/max per Locker\twait p99\thand-off p50\ttakeover p50\ttakeover max\toverlaps\terrors\t")
	for _, t := range cfg.Targets {
		for _, v := range cfg.Variants {
			var sel []contention.Cell
			for _, c := range cells {
				if c.Target == t.Name && c.Variant == v.Name {
					sel = append(sel, c)
				}
			}
			if len(sel) == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t.Name, v.Name,
				rangeOf(sel, func(c contention.Cell) float64 { return float64(c.Acquisitions) }, "%.0f"),
				requestsRange(sel),
				measuredRange(sel, contention.Cell.CommandsPerAcq, "%.1f"),
				measuredRange(sel, contention.Cell.CPUPer1000, "%.0f"),
				rangeOf(sel, contention.Cell.Fairness, "%.2f")+" ("+minMaxCounts(sel)+")",
				rangeOf(sel, func(c contention.Cell) float64 { return msOf(c.WaitP99) }, "%.1fms"),
				rangeOf(sel, func(c contention.Cell) float64 { return msOf(c.HandoffP50) * 1000 }, "%.0fµs"),
				rangeOf(sel, func(c contention.Cell) float64 { return msOf(pctOf(c.TakeoverLags, 50)) }, "%.1fms"),
				rangeOf(sel, func(c contention.Cell) float64 { return msOf(maxOf(c.TakeoverLags)) }, "%.1fms"),
				rangeOf(sel, func(c contention.Cell) float64 { return float64(c.Overlaps) }, "%.0f"),
				rangeOf(sel, func(c contention.Cell) float64 { return float64(c.Errors) }, "%.0f"))
		}
	}
	_ = tw.Flush()
}

func maxOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func pctOf(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, min(int(p/100*float64(len(s))+0.999999)-1, len(s)-1))]
}

func rangeOf(cells []contention.Cell, f func(contention.Cell) float64, format string) string {
	lo, hi := f(cells[0]), f(cells[0])
	for _, c := range cells[1:] {
		lo, hi = min(lo, f(c)), max(hi, f(c))
	}
	if fmt.Sprintf(format, lo) == fmt.Sprintf(format, hi) {
		return fmt.Sprintf(format, lo)
	}
	return fmt.Sprintf(format, lo) + "–" + fmt.Sprintf(format, hi)
}

// measuredRange is rangeOf for a measure that is -1 when not measured (n/a).
func measuredRange(cells []contention.Cell, f func(contention.Cell) float64, format string) string {
	for _, c := range cells {
		if f(c) < 0 {
			return "n/a"
		}
	}
	return rangeOf(cells, f, format)
}

// requestsRange is the range of requests per acquisition, n/a when a
// cell was not counted.
func requestsRange(cells []contention.Cell) string {
	for _, c := range cells {
		if c.RequestsPerAcq() < 0 {
			return "n/a"
		}
	}
	return rangeOf(cells, contention.Cell.RequestsPerAcq, "%.1f")
}

func minMaxCounts(cells []contention.Cell) string {
	var s []string
	for _, c := range cells {
		s = append(s, fmt.Sprintf("%d/%d", slices.Min(c.PerReplica), slices.Max(c.PerReplica)))
	}
	return strings.Join(s, ", ")
}

// benchChildCmd is the hidden replica process of 'bench --contention'.
func (a *App) benchChildCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "bench-child",
		Short:              "One replica of 'bench --contention' (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := contention.ChildMain(args, contention.OpenLeasehold, os.Stdin, a.Stdout); code != 0 {
				return &ExitError{Code: code, Err: fmt.Errorf("bench-child failed")}
			}
			return nil
		},
	}
}
