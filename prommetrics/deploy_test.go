package prommetrics_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v2"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// The files shipped next to this package, relative to it.
var (
	alertsFile     = filepath.Join("..", "deploy", "prometheus", "alerts.yml")
	alertsTestFile = filepath.Join("..", "deploy", "prometheus", "alerts_test.yml")
	dashboardFile  = filepath.Join("..", "deploy", "grafana", "leasehold.json")
	runbookFile    = filepath.Join("..", "docs", "runbook.md")
	runbookURL     = "https://github.com/leasehold/leasehold/blob/main/docs/runbook.md#"
)

// metricRE finds metric names in PromQL and text.
var metricRE = regexp.MustCompile(`\bleasehold_[a-z0-9_]+`)

// exported returns every series name the Observer exports, with the
// _bucket/_count/_sum names of its histograms, after one event of each kind.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := prommetrics.New(reg, prommetrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	obs.Observe(leasehold.Event{Kind: leasehold.EventContention, Locker: "approval"})
	obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "orders"})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]bool)
	for _, f := range fams {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_count", "_sum"} {
				names[f.GetName()+s] = true
			}
		}
	}
	if len(names) < 13 {
		t.Fatalf("expected at least 13 metric names, got %d: %v", len(names), names)
	}
	return names
}

// unknownMetrics returns the leasehold_* names in text that the Observer
// does not export, and how many names text uses.
func unknownMetrics(text string, known map[string]bool) (unknown []string, used int) {
	for _, name := range metricRE.FindAllString(text, -1) {
		used++
		if !known[name] && !slices.Contains(unknown, name) {
			unknown = append(unknown, name)
		}
	}
	return unknown, used
}

func TestUnknownMetricsCheckWorks(t *testing.T) {
	known := exported(t)
	bad, used := unknownMetrics(`rate(leasehold_lost_total[5m]) / leasehold_acquire_wait_seconds_count + leasehold_lock_losses_total`, known)
	if used != 3 || len(bad) != 1 || bad[0] != "leasehold_lock_losses_total" {
		t.Fatalf("expected one unknown name leasehold_lock_losses_total of 3, got %v of %d", bad, used)
	}
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found in PATH (%v): run `make test`, which installs it (scripts/install-test-deps.sh)", err)
	}
	return p
}

func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", alertsFile},
		{"test", "rules", alertsTestFile},
	} {
		out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertRulesUseExportedMetricsAndLinkTheRunbook(t *testing.T) {
	known := exported(t)
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(raw, &rf); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	anchors := runbookAnchors(t)
	alerts := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			bad, used := unknownMetrics(r.Expr, known)
			if used == 0 {
				t.Errorf("%s: expr uses no leasehold metric: %s", r.Alert, r.Expr)
			}
			if len(bad) > 0 {
				t.Errorf("%s: expr uses metrics the Observer does not export: %v", r.Alert, bad)
			}
			for _, a := range r.Annotations {
				if bad, _ := unknownMetrics(a, known); len(bad) > 0 {
					t.Errorf("%s: annotation names unknown metrics %v", r.Alert, bad)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: expected severity critical, warning or info, got %q", r.Alert, s)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[k] == "" {
					t.Errorf("%s: missing annotation %s", r.Alert, k)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURL)
			if !ok || anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: expected runbook_url %s%s, got %q", r.Alert, runbookURL, strings.ToLower(r.Alert), r.Annotations["runbook_url"])
			} else if !anchors[anchor] {
				t.Errorf("%s: %s has no section with anchor #%s", r.Alert, runbookFile, anchor)
			}
		}
	}
	if alerts < 6 {
		t.Fatalf("expected at least 6 alerts, got %d", alerts)
	}
}

// runbookAnchors returns the GitHub anchors of the runbook's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := make(map[string]bool)
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for line := range strings.Lines(string(raw)) {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimSpace(strings.TrimLeft(h, "#"))
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return anchors
}

// The runbook tells operators to grep for log messages: each one it quotes
// must be logged by the core, word for word.
func TestRunbookQuotesRealLogMessages(t *testing.T) {
	raw, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	files, _ := filepath.Glob(filepath.Join("..", "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	quoted := regexp.MustCompile("`(leasehold: [^`]+)`").FindAllStringSubmatch(string(raw), -1)
	if len(quoted) < 8 {
		t.Fatalf("expected the runbook to quote at least 8 log messages, got %d", len(quoted))
	}
	seen := make(map[string]bool)
	for _, q := range quoted {
		if seen[q[1]] {
			continue
		}
		seen[q[1]] = true
		if !strings.Contains(src.String(), `"`+q[1]+`"`) {
			t.Errorf("runbook quotes log message %q, which the root package does not log", q[1])
		}
	}
}

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // collapsed rows
}

func TestGrafanaDashboard(t *testing.T) {
	known := exported(t)
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("expected a title and a uid, got %q and %q", d.Title, d.UID)
	}
	vars := make(map[string]string)
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("expected a datasource variable, got variables %v", vars)
	}
	for _, v := range []string{"job", "instance", "locker"} {
		if vars[v] != "query" {
			t.Errorf("expected a %s query variable, got variables %v", v, vars)
		}
	}

	used := make(map[string]bool)
	ids := make(map[int]bool)
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no queries", p.Title)
			}
			if !strings.Contains(string(p.Datasource), "${datasource}") {
				t.Errorf("panel %q does not use the datasource variable: %s", p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				bad, n := unknownMetrics(tg.Expr, known)
				if n == 0 || len(bad) > 0 {
					t.Errorf("panel %q: expr %q uses unknown metrics %v (or none)", p.Title, tg.Expr, bad)
				}
				// Every selector filters by job, instance and locker.
				for _, sel := range selectorRE.FindAllString(tg.Expr, -1) {
					if !strings.Contains(sel, `{job=~"$job", instance=~"$instance", locker=~"$locker"`) {
						t.Errorf("panel %q: selector %s does not filter by the job, instance and locker variables", p.Title, sel)
					}
				}
				for _, m := range metricRE.FindAllString(tg.Expr, -1) {
					used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")] = true
				}
			}
		}
	}
	walk(d.Panels)
	// Every family the Observer exports has a panel.
	for name := range known {
		if strings.HasSuffix(name, "_bucket") || strings.HasSuffix(name, "_count") || strings.HasSuffix(name, "_sum") {
			continue
		}
		if !used[name] {
			t.Errorf("no dashboard panel shows %s", name)
		}
	}
}

// selectorRE finds the metric selectors of a PromQL expression.
var selectorRE = regexp.MustCompile(`\bleasehold_[a-z0-9_]+(\{[^}]*\})?`)

// dashboardExprs returns every panel query of the dashboard, with Grafana's
// variables replaced by values Prometheus accepts.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$job", ".*", "$instance", ".*", "$locker", ".*")
	exprs := make(map[string]string)
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for i, tg := range p.Targets {
				exprs[fmt.Sprintf("%s #%d", p.Title, i+1)] = vars.Replace(tg.Expr)
			}
		}
	}
	walk(d.Panels)
	return exprs
}

// Every panel query parses as PromQL: promtool checks them as recording
// rules. (The CLI's real-Prometheus test also runs each one against series
// scraped from a drill and requires an answer.)
func TestDashboardQueriesParse(t *testing.T) {
	bin := promtool(t)
	exprs := dashboardExprs(t)
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for _, title := range slices.Sorted(maps.Keys(exprs)) {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", len(rules)), Expr: exprs[title]})
	}
	raw, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), bin, "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard queries: %v\n%s", err, out)
	}
	if len(rules) < 20 {
		t.Fatalf("expected at least 20 dashboard queries, got %d", len(rules))
	}
}

// The core must not pull in client_golang: importing leasehold stays light.
func TestCoreDoesNotImportPrometheus(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "github.com/leasehold/leasehold").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for dep := range strings.Lines(string(out)) {
		if strings.Contains(dep, "prometheus") || strings.Contains(dep, "prommetrics") {
			t.Errorf("the root package depends on %s", strings.TrimSpace(dep))
		}
	}
}
