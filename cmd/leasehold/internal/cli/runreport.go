package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
	"github.com/spf13/pflag"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// Outcomes of `run`, the outcome label of leasehold_run_last_outcome.
var runOutcomes = []string{"ok", "failed", "not_acquired", "unavailable", "lost", "usage", "signal"}

// runReport is the final state of one `run` for cron jobs, which end before
// any scrape: written to a node_exporter textfile collector directory
// (--metrics-textfile) and/or pushed to a Pushgateway (--push).
type runReport struct {
	textfileDir, pushURL string
	name                 string

	reg     *prometheus.Registry
	obs     *prommetrics.Observer
	exit    prometheus.Gauge
	outcome *prometheus.GaugeVec
	held    prometheus.Gauge
	end     prometheus.Gauge

	mu       sync.Mutex
	heldFor  time.Duration
	acquired bool
}

// addReportFlags registers --metrics-textfile and --push.
func addReportFlags(f *pflag.FlagSet, r *runReport) {
	f.StringVar(&r.textfileDir, "metrics-textfile", "", "when run ends, write its final state (outcome, exit code, held duration) and lease metrics to `DIR`/leasehold_run_NAME.prom for node_exporter's textfile collector (atomically)")
	f.StringVar(&r.pushURL, "push", "", "when run ends, push its final state and lease metrics to the Pushgateway at `URL` (job leasehold_run, grouping label run=NAME; PUT replaces the last run's)")
}

// start checks the flags and builds the registry; it returns nil Observer
// when no report is asked for.
func (r *runReport) start(name string) (leasehold.Observer, error) {
	if r.textfileDir == "" && r.pushURL == "" {
		return nil, nil
	}
	if r.textfileDir != "" {
		if st, err := os.Stat(r.textfileDir); err != nil || !st.IsDir() {
			return nil, usage("--metrics-textfile %q: not a directory", r.textfileDir)
		}
	}
	r.name = name
	r.reg = prometheus.NewRegistry()
	obs, err := prommetrics.New(r.reg, prommetrics.Options{ConstLabels: map[string]string{"command": "run"}})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	obs.Init(name)
	r.obs = obs
	labels := prometheus.Labels{"command": "run", "locker": name}
	gauge := func(n, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: n, Help: help, ConstLabels: labels})
		r.reg.MustRegister(g)
		return g
	}
	r.exit = gauge("leasehold_run_last_exit_code", "Exit status of the last run: the command's own, 75 not acquired, 69 store unavailable, 77/78 store misconfigured, 79 lease lost, 2 bad usage.")
	r.held = gauge("leasehold_run_last_held_seconds", "How long the last run held its lease (0 when it did not acquire one).")
	r.end = gauge("leasehold_run_last_end_timestamp_seconds", "When the last run ended, in Unix seconds.")
	r.outcome = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "leasehold_run_last_outcome", ConstLabels: labels,
		Help: "1 for the outcome of the last run (ok, failed, not_acquired, unavailable, lost, usage, signal: run or the command ended by a signal), 0 for the others.",
	}, []string{"outcome"})
	r.reg.MustRegister(r.outcome)
	return leasehold.ObserverFunc(r.observe), nil
}

func (r *runReport) observe(e leasehold.Event) {
	r.obs.Observe(e)
	if e.Kind == leasehold.EventHeld {
		r.mu.Lock()
		r.heldFor, r.acquired = e.Duration, true
		r.mu.Unlock()
	}
}

// finish records how run ended (err is what it returns, outcome the
// runResult's) and writes the report; a report that cannot be written is a
// warning, never run's exit.
func (r *runReport) finish(a *App, err error, outcome string) error {
	if r.reg == nil {
		return err
	}
	code := ExitOK
	var ee *ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.Code
	case err != nil:
		code = ExitUsage // cobra's own errors (Execute maps them so)
	}
	r.exit.Set(float64(code))
	for _, o := range runOutcomes {
		v := 0.0
		if o == outcome {
			v = 1
		}
		r.outcome.WithLabelValues(o).Set(v)
	}
	r.mu.Lock()
	r.held.Set(r.heldFor.Seconds())
	r.mu.Unlock()
	r.end.Set(float64(time.Now().UnixMilli()) / 1000)
	if r.textfileDir != "" {
		file := filepath.Join(r.textfileDir, "leasehold_run_"+fileSafe(r.name)+".prom")
		if werr := prometheus.WriteToTextfile(file, r.reg); werr != nil {
			fmt.Fprintf(a.Stderr, "leasehold run: --metrics-textfile: %v\n", werr)
		}
	}
	if r.pushURL != "" {
		if perr := push.New(r.pushURL, "leasehold_run").Grouping("run", r.name).Gatherer(r.reg).Push(); perr != nil {
			fmt.Fprintf(a.Stderr, "leasehold run: --push: %v\n", storeurl.RedactError(perr, r.pushURL))
		}
	}
	return err
}

func runOutcome(code int) string {
	switch {
	case code == ExitOK:
		return "ok"
	case code == ExitNotAcquired:
		return "not_acquired"
	case code == ExitUnavailable:
		return "unavailable"
	case code == ExitLeaseLost:
		return "lost"
	case code == ExitUsage:
		return "usage"
	case code > 128 && code < 160:
		return "signal"
	}
	return "failed"
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

func fileSafe(name string) string { return unsafeFileChars.ReplaceAllString(name, "_") }

// teeObservers returns an Observer that calls each non-nil one (nil when
// there is none).
func teeObservers(obs ...leasehold.Observer) leasehold.Observer {
	var live []leasehold.Observer
	for _, o := range obs {
		if o != nil {
			live = append(live, o)
		}
	}
	switch len(live) {
	case 0:
		return nil
	case 1:
		return live[0]
	}
	return leasehold.ObserverFunc(func(e leasehold.Event) {
		for _, o := range live {
			o.Observe(e)
		}
	})
}

// initSeriesOf creates the series of locker at zero when obs can
// (prommetrics.Observer.Init), so the first event shows in increase().
func initSeriesOf(obs leasehold.Observer, locker string) {
	if in, ok := obs.(interface{ Init(string, ...string) }); ok {
		in.Init(locker)
	}
}
