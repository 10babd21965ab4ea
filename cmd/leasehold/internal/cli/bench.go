package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

type benchOpts struct {
	duration    time.Duration
	concurrency []int
	waiters     int
	metricsAddr string
}

// latencyJSON is a latency distribution in milliseconds.
type latencyJSON struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

type cycleJSON struct {
	Concurrency int         `json:"concurrency"`
	Cycles      int         `json:"cycles"`
	Errors      int         `json:"errors"`
	PerSecond   float64     `json:"cycles_per_sec"`
	Acquire     latencyJSON `json:"acquire"`
	Release     latencyJSON `json:"release"`
}

type handoffJSON struct {
	Waiters      int         `json:"waiters"`
	Handoffs     int         `json:"handoffs"`
	Reacquired   int         `json:"reacquired_by_releaser"`
	Errors       int         `json:"errors"`
	Latency      latencyJSON `json:"latency"`
	MinPerWaiter int         `json:"min_acquisitions_per_waiter"`
	MaxPerWaiter int         `json:"max_acquisitions_per_waiter"`
}

type benchJSON struct {
	Store      string      `json:"store"`
	DurationMS int64       `json:"duration_ms"`
	Cycles     []cycleJSON `json:"acquire_release"`
	Handoff    handoffJSON `json:"handoff"`
}

func latency(ds []time.Duration) latencyJSON {
	if len(ds) == 0 {
		return latencyJSON{}
	}
	slices.Sort(ds)
	at := func(p float64) float64 {
		i := int(p/100*float64(len(ds))+0.999999) - 1
		return msOf(ds[max(0, min(i, len(ds)-1))])
	}
	return latencyJSON{P50: at(50), P90: at(90), P99: at(99), Max: msOf(ds[len(ds)-1])}
}

func parseConcurrency(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1024 {
			return nil, usage("--concurrency: %q is not a number between 1 and 1024 (want e.g. 1,16)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (a *App) benchCmd() *cobra.Command {
	var (
		o    benchOpts
		co   contentionOpts
		conc string
	)
	cmd := &cobra.Command{
		Use:   "bench --store URL [--duration 5s] [--concurrency 1,16] [--waiters 8]",
		Short: "Measure acquire+release throughput and latency, and waiter hand-off, against a store",
		Long: `bench measures a store through the leasehold Locker, in two parts.

acquire/release: for each level in --concurrency, that many goroutines share
one Locker and each loops TryAcquire + Release on its own key for --duration.
It reports cycles per second and latency percentiles of acquire and release.

hand-off: --waiters goroutines, each with its own Locker (as separate
processes would be), contend for one key for --duration: the holder releases
at once and the next waiter, woken by the store's release notification,
acquires. It reports the time from the start of Release to the next holder's
acquire (hand-offs to a different waiter only), how often the releaser won
again, and the fewest and most acquisitions per waiter (fairness).

Keys start with "leasehold-bench:" and are released at the end. The memory
store is allowed (it measures the Locker alone). Progress goes to stderr: a
live line on a terminal, else one dot per second.

contention (--contention --replicas 8 --processes): --replicas child
processes (each its own Locker and store client) loop Acquire, hold
--hold, Release on one key for --cell, on each of --redis, --etcd and
--postgres, --passes times, the --variant builds interleaved. It reports
store requests per acquisition (Redis: counted in each replica's client;
etcd: --etcd-metrics; PostgreSQL: pg_stat_statements), min/max
acquisitions per replica, wait p99, hand-off p50 (Release sent to the next
holder's Acquire returning, on the shared CLOCK_MONOTONIC), and the
takeover lag after the holder is killed with SIGKILL (next acquire minus
the killed holder's acquire + --ttl). With --lockers L and --keys K each
replica runs L Lockers (each its own store client) that take the K keys in
turn (round-robin), fairness is min/max over all replicas × L Lockers, and
Redis also reports the server's commands (inside scripts too) and CPU time
per acquisition (INFO commandstats and cpu). scripts/bench-contention.sh
starts the servers and builds an older commit and the peers as variants.

--json output fields: store, duration_ms, acquire_release[]{concurrency,
cycles, errors, cycles_per_sec, acquire{p50_ms, p90_ms, p99_ms, max_ms},
release{…}}, handoff{waiters, handoffs, reacquired_by_releaser, errors,
latency{p50_ms, p90_ms, p99_ms, max_ms}, min_acquisitions_per_waiter,
max_acquisitions_per_waiter}.

Exit status: 0, 69 when every operation failed (store unavailable), 77/78
when the store refuses the credentials or is misconfigured, 2 on bad usage.`,
		Example: `  leasehold bench --store redis://127.0.0.1:6379 --duration 5s --concurrency 1,16
  leasehold bench --store memory --json
  leasehold bench --contention --replicas 8 --processes --redis redis://127.0.0.1:6379`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if co.on {
				return a.benchContention(cmd.Context(), &co)
			}
			var err error
			if o.concurrency, err = parseConcurrency(conc); err != nil {
				return err
			}
			switch {
			case o.duration <= 0:
				return usage("--duration must be > 0, got %v", o.duration)
			case o.waiters < 2 || o.waiters > 1024:
				return usage("--waiters must be between 2 and 1024, got %d", o.waiters)
			}
			return a.bench(cmd.Context(), &o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", 5*time.Second, "how long each part runs")
	f.StringVar(&conc, "concurrency", "1,16", "comma-separated goroutine counts for acquire/release")
	f.IntVar(&o.waiters, "waiters", 8, "goroutines contending in the hand-off part, each with its own Locker")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address while it runs")
	co.register(f)
	return cmd
}

func (a *App) bench(ctx context.Context, o *benchOpts) error {
	obs, stopMetrics, err := a.startMetrics(o.metricsAddr, "bench")
	if err != nil {
		return err
	}
	defer stopMetrics()
	st, err := a.openStore(ctx, "bench", false)
	if err != nil {
		return err
	}
	defer st.Close()
	opts := leasehold.Options{Name: "bench", TTL: 10 * time.Second, Logger: a.logger(), Observer: obs}
	prefix := "leasehold-bench:" + leasehold.NewToken()[:8] + ":"
	out := benchJSON{Store: st.Desc, DurationMS: o.duration.Milliseconds()}
	var firstErr error
	total, failed := 0, 0

	for _, c := range o.concurrency {
		p := a.progress(fmt.Sprintf("acquire/release, %d goroutine(s)", c), o.duration)
		r, err := benchCycles(ctx, st.Store, opts, prefix, c, o.duration)
		p.stop()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		total += r.Cycles + r.Errors
		failed += r.Errors
		out.Cycles = append(out.Cycles, r)
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() == nil {
		p := a.progress(fmt.Sprintf("hand-off, %d waiters", o.waiters), o.duration)
		h, err := benchHandoff(ctx, st.Store, opts, prefix+"handoff", o.waiters, o.duration)
		p.stop()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		total += h.Handoffs + h.Reacquired + h.Errors
		failed += h.Errors
		out.Handoff = h
	}
	if total > 0 && failed == total {
		if errors.Is(firstErr, leasehold.ErrMisconfigured) {
			return misconfigured(st.Desc, "bench: every operation failed: ", st.Redact(firstErr))
		}
		return Exit(ExitUnavailable, "bench: every operation failed; store %s unavailable: %v", st.Desc, st.Redact(firstErr))
	}
	if firstErr != nil {
		fmt.Fprintf(a.Stderr, "leasehold bench: %d of %d operations failed; first error: %v\n", failed, total, st.Redact(firstErr))
	}
	if a.json {
		return writeJSON(a.Stdout, out)
	}
	printBench(a.Stdout, out)
	return nil
}

func printBench(w io.Writer, b benchJSON) {
	fmt.Fprintf(w, "store %s, %v per part\n\n", b.Store, time.Duration(b.DurationMS)*time.Millisecond)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "acquire+release\tgoroutines\tcycles/s\tacq p50\tacq p90\tacq p99\tacq max\trel p50\trel p99\terrors\t")
	for _, c := range b.Cycles {
		fmt.Fprintf(tw, "\t%d\t%.0f\t%.3fms\t%.3fms\t%.3fms\t%.3fms\t%.3fms\t%.3fms\t%d\t\n", c.Concurrency, c.PerSecond,
			c.Acquire.P50, c.Acquire.P90, c.Acquire.P99, c.Acquire.Max, c.Release.P50, c.Release.P99, c.Errors)
	}
	_ = tw.Flush()
	h := b.Handoff
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "hand-off\twaiters\thand-offs\tp50\tp90\tp99\tmax\treacquired\tper waiter\terrors\t")
	fmt.Fprintf(tw, "\t%d\t%d\t%.3fms\t%.3fms\t%.3fms\t%.3fms\t%d\t%d..%d\t%d\t\n", h.Waiters, h.Handoffs,
		h.Latency.P50, h.Latency.P90, h.Latency.P99, h.Latency.Max, h.Reacquired, h.MinPerWaiter, h.MaxPerWaiter, h.Errors)
	_ = tw.Flush()
}

// benchCycles runs c goroutines doing TryAcquire+Release on their own keys
// through one Locker for d.
func benchCycles(ctx context.Context, st driver.Store, opts leasehold.Options, prefix string, c int, d time.Duration) (cycleJSON, error) {
	l, err := leasehold.New(st, opts)
	if err != nil {
		return cycleJSON{}, err
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	type result struct {
		acq, rel []time.Duration
		errs     int
		err      error
	}
	results := make([]result, c)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range c {
		wg.Go(func() {
			r := &results[i]
			key := fmt.Sprintf("%scycle:%d", prefix, i)
			for ctx.Err() == nil {
				t0 := time.Now()
				lease, err := l.TryAcquire(ctx, key)
				t1 := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						r.errs++
						if r.err == nil {
							r.err = err
						}
						time.Sleep(10 * time.Millisecond) // do not spin on a dead store
					}
					continue
				}
				err = lease.Release(ctx)
				t2 := time.Now()
				if err != nil {
					r.errs++
					if r.err == nil {
						r.err = err
					}
					continue
				}
				r.acq = append(r.acq, t1.Sub(t0))
				r.rel = append(r.rel, t2.Sub(t1))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	out := cycleJSON{Concurrency: c}
	var acq, rel []time.Duration
	var firstErr error
	for _, r := range results {
		acq = append(acq, r.acq...)
		rel = append(rel, r.rel...)
		out.Errors += r.errs
		if firstErr == nil {
			firstErr = r.err
		}
	}
	out.Cycles = len(acq)
	out.PerSecond = float64(out.Cycles) / elapsed.Seconds()
	out.Acquire, out.Release = latency(acq), latency(rel)
	return out, firstErr
}

// benchHandoff runs n goroutines, each with its own Locker, contending for
// key for d, and measures release-to-next-acquire latency.
func benchHandoff(ctx context.Context, st driver.Store, opts leasehold.Options, key string, n int, d time.Duration) (handoffJSON, error) {
	lockers := make([]*leasehold.Locker, n)
	for i := range lockers {
		l, err := leasehold.New(st, opts)
		if err != nil {
			return handoffJSON{}, err
		}
		defer l.Close()
		lockers[i] = l
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		mu          sync.Mutex
		lastRelease time.Time
		lastHolder  = -1
		lat         []time.Duration
		reacquired  int
		errs        int
		firstErr    error
		counts      = make([]int, n)
		inside      atomic.Int32
	)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				lease, err := lockers[i].Acquire(ctx, key)
				now := time.Now()
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, leasehold.ErrNotAcquired) {
						mu.Lock()
						errs++
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				if inside.Add(1) != 1 {
					mu.Lock()
					errs++
					if firstErr == nil {
						firstErr = errors.New("two holders of one key at once: the store does not exclude")
					}
					mu.Unlock()
				}
				mu.Lock()
				counts[i]++
				switch {
				case lastHolder == i:
					reacquired++
				case lastHolder >= 0:
					lat = append(lat, now.Sub(lastRelease))
				}
				lastHolder = i
				lastRelease = time.Now()
				mu.Unlock()
				inside.Add(-1)
				if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
					mu.Lock()
					errs++
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	out := handoffJSON{Waiters: n, Handoffs: len(lat), Reacquired: reacquired, Errors: errs, Latency: latency(lat)}
	out.MinPerWaiter, out.MaxPerWaiter = slices.Min(counts), slices.Max(counts)
	return out, firstErr
}

// progress shows that a bench part is running, on stderr.
type progressLine struct {
	stopC chan struct{}
	done  chan struct{}
}

func (a *App) progress(what string, d time.Duration) *progressLine {
	p := &progressLine{stopC: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(p.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		if a.StderrIsTerminal {
			fmt.Fprintf(a.Stderr, "\rbench: %s 0s/%v ", what, d)
		} else {
			fmt.Fprintf(a.Stderr, "bench: %s ", what)
		}
		for {
			select {
			case <-p.stopC:
				if a.StderrIsTerminal {
					fmt.Fprintf(a.Stderr, "\r\033[K")
				} else {
					fmt.Fprintln(a.Stderr, " done")
				}
				return
			case <-t.C:
				if a.StderrIsTerminal {
					fmt.Fprintf(a.Stderr, "\rbench: %s %v/%v ", what, time.Since(start).Round(time.Second), d)
				} else {
					fmt.Fprint(a.Stderr, ".")
				}
			}
		}
	}()
	return p
}

func (p *progressLine) stop() {
	close(p.stopC)
	<-p.done
}
