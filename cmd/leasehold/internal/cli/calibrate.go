package cli

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/calibrate"
)

type calibrateJSON struct {
	Inputs struct {
		P99MS             float64 `json:"p99_ms"`
		JitterMS          float64 `json:"jitter_ms"`
		GuardMS           float64 `json:"guard_ms"`
		DetectionJitterMS float64 `json:"detection_jitter_ms"`
		SLOMS             float64 `json:"slo_ms"`
		RenewTimeoutMS    float64 `json:"renew_timeout_ms"`
		MaxFailures       int     `json:"max_failures"`
	} `json:"inputs"`
	Samples *struct {
		Count int     `json:"count"`
		P50MS float64 `json:"p50_ms"`
		P99MS float64 `json:"p99_ms"`
		MaxMS float64 `json:"max_ms"`
	} `json:"samples,omitempty"`
	TTLMS               float64          `json:"ttl_ms"`
	RenewIntervalMS     float64          `json:"renew_interval_ms"`
	BudgetMS            float64          `json:"budget_ms"`
	BudgetHeadroomMS    float64          `json:"budget_headroom_ms"`
	BudgetOK            bool             `json:"budget_ok"`
	SafeRenewIntervalMS float64          `json:"safe_renew_interval_ms"`
	SafeMaxFailures     int              `json:"safe_max_failures"`
	WorstTakeoverMS     float64          `json:"worst_takeover_ms"`
	Verdict             string           `json:"verdict"`
	SlackMS             float64          `json:"slack_ms"`
	Warnings            []string         `json:"warnings"`
	Advice              []string         `json:"advice"`
	Prometheus          *promCalibration `json:"prometheus,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (a *App) calibrateCmd() *cobra.Command {
	var (
		in      calibrate.Input
		samples string
		prom    promSource
		fromP   *promCalibration
	)
	cmd := &cobra.Command{
		Use:   "calibrate (--p99 D | --samples FILE) --jitter D --guard D [--slo D]",
		Short: "Compute TTL, renewal interval, failure budget and worst takeover from measured numbers",
		Long: `calibrate turns measured numbers into lease timings:

  TTL             = p99 critical section + jitter + guard
  renew interval  = TTL / 3
  failure budget  = renew interval + max failures × renew timeout + the
                    gaps between retries (10ms each at least); it must end
                    before the local expiry guard (TTL − drift margin, TTL/20
                    + 5ms) so the holder abandons the lease (and stops its
                    work) before the lock expires for everyone else. This is
                    the formula the library warns with (calibrate.Budget)
  worst takeover  ≈ TTL + detection jitter (a crashed holder's lock is taken
                    over when it expires, plus how late a waiter notices)

With --slo it gives a verdict against the takeover SLO, and when the SLO cannot
be met, says which input to change and by how much.

The p99 comes from --p99 or is computed from --samples FILE: one held duration
per line, a Go duration (1.5s, 250ms) or a plain number of milliseconds;
blank lines and lines starting with # are skipped. Bad lines are reported
with their line numbers. Or it comes from live data: --prometheus URL --locker
NAME [--window 7d] reads histogram_quantile(0.99, ...) of the released leases'
leasehold_held_seconds over the window through Prometheus's HTTP API, and,
unless --jitter is given, takes the jitter from the renewals' round trips
(leasehold_renew_seconds p99).

--json output fields: inputs{p99_ms, jitter_ms, guard_ms, detection_jitter_ms,
slo_ms, renew_timeout_ms, max_failures}, samples{count, p50_ms, p99_ms,
max_ms} (with --samples), ttl_ms, renew_interval_ms, budget_ms,
budget_headroom_ms, budget_ok, safe_renew_interval_ms, safe_max_failures,
worst_takeover_ms, verdict (no_slo, meets_slo, slo_impossible), slack_ms,
warnings, advice.

Exit status: 0, 1 when the SLO cannot be met, 2 on bad input.`,
		Example: `  leasehold calibrate --p99 18s --jitter 4s --guard 2s --slo 30s
  leasehold calibrate --prometheus http://prometheus:9090 --locker approval --window 7d --guard 1s --slo 30s
  leasehold calibrate --samples held.txt --jitter 500ms --guard 1s --slo 10s --json`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			var sum *calibrate.Summary
			switch {
			case prom.url != "" && (samples != "" || f.Changed("p99")):
				return usage("give one of --p99, --samples and --prometheus")
			case prom.url != "" && !f.Changed("guard"):
				return usage("missing --guard D: the extra margin on top, e.g. --guard 1s")
			case prom.url != "":
				var err error
				if fromP, err = prom.read(cmd.Context(), &in, f.Changed("jitter")); err != nil {
					return err
				}
			case samples != "" && f.Changed("p99"):
				return usage("give either --p99 or --samples, not both")
			case samples == "" && !f.Changed("p99"):
				return usage("missing --p99 D (the 99th percentile of the time the lock is held) or --samples FILE")
			case !f.Changed("jitter"):
				return usage("missing --jitter D: the budget for network and store tail latency, e.g. --jitter 500ms")
			case !f.Changed("guard"):
				return usage("missing --guard D: the extra margin on top, e.g. --guard 1s")
			}
			if samples != "" {
				fh, err := os.Open(samples)
				if err != nil {
					return usage("--samples: %v", err)
				}
				ds, err := calibrate.ParseSamples(fh)
				fh.Close()
				if err != nil {
					return usage("--samples %s: %v", samples, err)
				}
				s := calibrate.Summarize(ds)
				sum = &s
				in.P99 = s.P99
				if in.P99 <= 0 {
					return usage("--samples %s: the p99 of %d samples is 0; the samples must be held durations > 0", samples, s.Count)
				}
			}
			r, err := calibrate.Compute(in)
			if err != nil {
				return usage("%v", err)
			}
			if a.json {
				j := calibrationJSON(r, sum)
				j.Prometheus = fromP
				if err := writeJSON(a.Stdout, j); err != nil {
					return err
				}
			} else {
				if fromP != nil {
					printPromSource(a, fromP)
				}
				printCalibration(a, r, sum)
			}
			if r.Verdict == calibrate.Impossible {
				return &ExitError{Code: ExitFailure}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&in.P99, "p99", 0, "99th percentile of the time the lock is held (the critical section)")
	f.StringVar(&samples, "samples", "", "file of held durations, one per line (Go duration or milliseconds); computes the p99")
	f.DurationVar(&in.Jitter, "jitter", 0, "jitter budget: network and store tail latency, pauses")
	f.DurationVar(&in.Guard, "guard", 0, "extra margin")
	f.DurationVar(&in.DetectionJitter, "detection-jitter", 0, "how late after expiry a waiter takes over (default: --jitter)")
	f.DurationVar(&in.SLO, "slo", 0, "takeover SLO: longest acceptable time from a holder's crash to the next owner; 0 = none")
	f.DurationVar(&in.RenewTimeout, "renew-timeout", 0, "bound on each renewal attempt (default: the library's default for the TTL, at most 2s)")
	f.IntVar(&in.MaxFailures, "max-failures", calibrate.DefaultMaxFailures, "consecutive failed renewals before the lease is abandoned")
	prom.register(f)
	return cmd
}

func calibrationJSON(r calibrate.Result, sum *calibrate.Summary) calibrateJSON {
	var j calibrateJSON
	in := r.Input
	j.Inputs.P99MS, j.Inputs.JitterMS, j.Inputs.GuardMS = ms(in.P99), ms(in.Jitter), ms(in.Guard)
	j.Inputs.DetectionJitterMS, j.Inputs.SLOMS = ms(in.DetectionJitter), ms(in.SLO)
	j.Inputs.RenewTimeoutMS, j.Inputs.MaxFailures = ms(in.RenewTimeout), in.MaxFailures
	if sum != nil {
		j.Samples = &struct {
			Count int     `json:"count"`
			P50MS float64 `json:"p50_ms"`
			P99MS float64 `json:"p99_ms"`
			MaxMS float64 `json:"max_ms"`
		}{sum.Count, ms(sum.P50), ms(sum.P99), ms(sum.Max)}
	}
	j.TTLMS, j.RenewIntervalMS = ms(r.TTL), ms(r.RenewInterval)
	j.BudgetMS, j.BudgetHeadroomMS, j.BudgetOK = ms(r.BudgetTime), ms(r.BudgetHeadroom), r.BudgetOK
	j.SafeRenewIntervalMS, j.SafeMaxFailures = ms(r.SafeRenewInterval), r.SafeMaxFailures
	j.WorstTakeoverMS, j.Verdict, j.SlackMS = ms(r.WorstTakeover), string(r.Verdict), ms(r.Slack)
	j.Warnings, j.Advice = r.Warnings, r.Advice
	if j.Warnings == nil {
		j.Warnings = []string{}
	}
	if j.Advice == nil {
		j.Advice = []string{}
	}
	return j
}

func printCalibration(a *App, r calibrate.Result, sum *calibrate.Summary) {
	in := r.Input
	w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	if sum != nil {
		fmt.Fprintf(w, "samples\t%d\tp50 %s, p99 %s, max %s\n", sum.Count, human(sum.P50), human(sum.P99), human(sum.Max))
	}
	fmt.Fprintf(w, "ttl\t%s\t= p99 %s + jitter %s + guard %s\n", human(r.TTL), human(in.P99), human(in.Jitter), human(in.Guard))
	fmt.Fprintf(w, "renew every\t%s\t= TTL/3\n", human(r.RenewInterval))
	status := fmt.Sprintf("ok: abandoned %s before the local guard (TTL − %s)", human(r.BudgetHeadroom), human(r.DriftMargin))
	if !r.BudgetOK {
		status = "TOO LARGE: the lease expires first"
	}
	fmt.Fprintf(w, "failure budget\t%s\t= renew every %s + %d × renew timeout %s + gaps; %s\n",
		human(r.BudgetTime), human(r.RenewInterval), in.MaxFailures, human(in.RenewTimeout), status)
	fmt.Fprintf(w, "worst takeover\t%s\t= TTL + detection jitter %s\n", human(r.WorstTakeover), human(in.DetectionJitter))
	switch r.Verdict {
	case calibrate.Meets:
		fmt.Fprintf(w, "takeover SLO\t%s\tMEETS the SLO with %s to spare\n", human(in.SLO), human(r.Slack))
	case calibrate.Impossible:
		fmt.Fprintf(w, "takeover SLO\t%s\tIMPOSSIBLE: worst takeover is %s over\n", human(in.SLO), human(-r.Slack))
	default:
		fmt.Fprintf(w, "takeover SLO\t-\tnone given (--slo)\n")
	}
	_ = w.Flush()
	for _, s := range r.Warnings {
		fmt.Fprintf(a.Stdout, "warning: %s\n", s)
	}
	for _, s := range r.Advice {
		fmt.Fprintf(a.Stdout, "to meet the SLO: %s\n", s)
	}
	fmt.Fprintf(a.Stdout, "\nleasehold run flags: --ttl %s --renew-every %s --renew-timeout %s --max-renew-failures %d\n",
		human(r.TTL), human(recommendedRenew(r)), human(in.RenewTimeout), recommendedFailures(r))
}

func recommendedRenew(r calibrate.Result) time.Duration {
	if r.BudgetOK || r.SafeMaxFailures >= 1 || r.SafeRenewInterval == 0 {
		return r.RenewInterval
	}
	return r.SafeRenewInterval.Round(time.Millisecond)
}

func recommendedFailures(r calibrate.Result) int {
	if r.BudgetOK || r.SafeMaxFailures < 1 {
		return r.Input.MaxFailures
	}
	return r.SafeMaxFailures
}
