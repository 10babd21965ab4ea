package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v2"

	"github.com/leasehold/leasehold/prommetrics"
)

// repoFile returns the path of a file of the repository (e.g.
// deploy/prometheus/alerts.yml), looked up from the test's directory
// upwards, so the test does not depend on where its package lives.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("%s not found above the test's directory", rel)
		}
		dir = parent
	}
}

func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found in PATH (%v): run `make test`, which installs it (scripts/install-test-deps.sh)", name, err)
	}
	return p
}

// recordDrill runs a drill in process with --record-metrics and returns the
// recorded scrapes (the drill's exit status does not matter: a fail-open
// drill fails its duplicate check on purpose).
func recordDrill(t *testing.T, args ...string) []prommetrics.Scrape {
	t.Helper()
	file := filepath.Join(t.TempDir(), "drill.prom")
	args = append([]string{"drill", "--record-metrics", file, "--record-interval", "500ms"}, args...)
	code, out, errOut := runMain(t, args...)
	if code != ExitOK && code != ExitFailure {
		t.Fatalf("%q: exit %d\n%s\n%s", args, code, out, errOut)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	scrapes, err := prommetrics.ReadRecording(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(scrapes) < 3 {
		t.Fatalf("expected at least 3 scrapes of a drill, got %d", len(scrapes))
	}
	t.Logf("%q: %d scrapes over %v\n%s", args, len(scrapes), scrapes[len(scrapes)-1].Time.Sub(scrapes[0].Time), lastLine(out))
	return scrapes
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// inputSeries turns recorded scrapes into promtool input series, one value
// per step from the first scrape, labelled job="drill": "_" before a series
// first appears, and its last value for another tail after the last scrape
// (a long-running process keeps being scraped after a fault, with no new
// events, which is when alerts must fire and then resolve).
func inputSeries(t *testing.T, scrapes []prommetrics.Scrape, step, tail time.Duration) []map[string]string {
	t.Helper()
	t0 := scrapes[0].Time
	last := int(scrapes[len(scrapes)-1].Time.Sub(t0).Round(step) / step)
	values := make(map[string][]string)
	for _, s := range scrapes {
		slot := int(s.Time.Sub(t0).Round(step) / step)
		vec, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{Timestamp: model.TimeFromUnixNano(s.Time.UnixNano())}, s.Families...)
		if err != nil {
			t.Fatal(err)
		}
		for _, smp := range vec {
			if !strings.HasPrefix(string(smp.Metric[model.MetricNameLabel]), "leasehold_") {
				continue
			}
			smp.Metric["job"] = "drill"
			key := smp.Metric.String()
			v := values[key]
			if v == nil {
				v = slices.Repeat([]string{"_"}, last+1)
				values[key] = v
			}
			v[slot] = strconv.FormatFloat(float64(smp.Value), 'g', -1, 64)
		}
	}
	extra := int(tail / step)
	var out []map[string]string
	for _, key := range slices.Sorted(func(yield func(string) bool) {
		for k := range values {
			if !yield(k) {
				return
			}
		}
	}) {
		v := values[key]
		// Fill gaps between scrapes (a slot no scrape fell into) with the
		// value before, as Prometheus would look back to it.
		for i := 1; i < len(v); i++ {
			if v[i] == "_" && v[i-1] != "_" {
				v[i] = v[i-1]
			}
		}
		text := strings.Join(v, " ") + fmt.Sprintf(" %sx%d", v[len(v)-1], extra)
		out = append(out, map[string]string{"series": key, "values": text})
	}
	return out
}

// alertCheck is what must (or must not) be firing at a time after the
// drill's first scrape.
type alertCheck struct {
	at        time.Duration
	firing    []string // alerts that must be firing
	notFiring []string // alerts that must not be pending or firing
	none      bool     // no alert at all, pending or firing
}

// replayAlerts runs promtool test rules: the recorded series through
// deploy/prometheus/alerts.yml, evaluated every 15s, with checks.
func replayAlerts(t *testing.T, scrapes []prommetrics.Scrape, checks []alertCheck) {
	t.Helper()
	bin := needTool(t, "promtool")
	const step = 500 * time.Millisecond
	var tests []map[string]any
	for _, c := range checks {
		eval := model.Duration(c.at).String()
		for _, a := range c.firing {
			tests = append(tests, map[string]any{
				"expr": fmt.Sprintf(`max by (alertname) (ALERTS{alertstate="firing", alertname=%q})`, a), "eval_time": eval,
				"exp_samples": []map[string]any{{"labels": fmt.Sprintf(`{alertname=%q}`, a), "value": 1}},
			})
		}
		for _, a := range c.notFiring {
			tests = append(tests, map[string]any{
				"expr": fmt.Sprintf(`ALERTS{alertname=%q}`, a), "eval_time": eval, "exp_samples": []any{},
			})
		}
		if c.none {
			tests = append(tests, map[string]any{"expr": `ALERTS`, "eval_time": eval, "exp_samples": []any{}})
		}
	}
	doc := map[string]any{
		"rule_files":          []string{repoFile(t, filepath.Join("deploy", "prometheus", "alerts.yml"))},
		"evaluation_interval": "15s",
		"tests": []map[string]any{{
			"interval":         model.Duration(step).String(),
			"input_series":     inputSeries(t, scrapes, step, 20*time.Minute),
			"promql_expr_test": tests,
		}},
	}
	raw, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "replay_test.yml")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), bin, "test", "rules", file).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules on the recorded drill: %v\n%s", err, out)
	}
}

// Each alert fires under the drill fault that should trigger it, on series
// recorded from a real drill, and every alert is silent in a clean drill and
// once the faults are long past. (Issue 16: the stale-write alert never fired
// in a drill, and no alert with a for: could be exercised by one.)
// LeaseholdLeaseAbandoned, LeaseholdAcquireWaitHigh and
// LeaseholdNotOwnedRatioHigh are not produced reliably by the drill's faults
// (the expiry guard ends a lease before the renewal failure budget, waits
// stay under a TTL, not-owned answers are spread over replicas); they are
// tested on synthetic series in deploy/prometheus/alerts_test.yml.
func TestAlertsOnRecordedDrills(t *testing.T) {
	quietLater := alertCheck{at: 17 * time.Minute, none: true}
	scenarios := []struct {
		name   string
		args   []string
		checks []alertCheck
	}{
		{"clean", []string{"--faults", "none", "--jobs", "12"}, []alertCheck{
			{at: 5 * time.Second, none: true}, {at: 90 * time.Second, none: true},
			{at: 6 * time.Minute, none: true}, {at: 12 * time.Minute, none: true},
		}},
		{"pause", []string{"--faults", "pause", "--jobs", "12"}, []alertCheck{
			{at: 90 * time.Second, firing: []string{"LeaseholdStaleWritesRejected"}, notFiring: []string{"LeaseholdFailOpenFallback", "LeaseholdStoreErrors"}},
			quietLater,
		}},
		{"outage", []string{"--faults", "outage", "--outage", "3s", "--jobs", "12"}, []alertCheck{
			{at: 90 * time.Second, firing: []string{"LeaseholdStoreErrors"}, notFiring: []string{"LeaseholdFailOpenFallback"}},
			// 2 minutes after the outage (which ended within the
			// first 15 s): resolved.
			{at: 2*time.Minute + 30*time.Second, notFiring: []string{"LeaseholdStoreErrors"}},
			quietLater,
		}},
		{"fail-open outage", []string{"--faults", "outage", "--outage", "3s", "--jobs", "12", "--on-store-error", "fail-open"}, []alertCheck{
			{at: 30 * time.Second, firing: []string{"LeaseholdFailOpenFallback"}},
			{at: 90 * time.Second, firing: []string{"LeaseholdFailOpenFallback", "LeaseholdStoreErrors"}},
			quietLater,
		}},
		{"restart", []string{"--faults", "restart", "--jobs", "12"}, []alertCheck{
			{at: 30 * time.Second, firing: []string{"LeaseholdLeasesLost"}, notFiring: []string{"LeaseholdFailOpenFallback"}},
			quietLater,
		}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			replayAlerts(t, recordDrill(t, append(sc.args, "--seed", "16")...), sc.checks)
		})
	}
}
