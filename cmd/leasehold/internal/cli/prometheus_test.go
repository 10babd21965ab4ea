package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// promServer is a real Prometheus server (Debian's prometheus package)
// started for one test.
type promServer struct {
	t   *testing.T
	url string
}

// startPrometheus starts prometheus with config (YAML; rule files by
// absolute path) and extra flags, waits until it is ready, and stops it at
// cleanup.
func startPrometheus(t *testing.T, config string, extra ...string) *promServer {
	t.Helper()
	bin := needTool(t, "prometheus")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	args := append([]string{
		"--config.file=" + cfg, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr, "--log.level=warn",
	}, extra...)
	var logs strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	p := &promServer{t: t, url: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-done:
			t.Fatalf("prometheus exited: %s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 30s: %v\n%s", err, logs.String())
		}
	}
}

// promResult is one series of an instant query's answer.
type promResult struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query at time at (now when zero) through the HTTP
// API and returns the series of the vector; it fails the test on an error
// answer (a query that does not parse).
func (p *promServer) query(ctx context.Context, expr string, at time.Time) ([]promResult, error) {
	v := url.Values{"query": {expr}}
	if !at.IsZero() {
		v.Set("time", fmt.Sprintf("%.3f", float64(at.UnixMilli())/1000))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/api/v1/query?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promResult `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, body.Error)
	}
	if body.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: expected a vector, got %s", expr, body.Data.ResultType)
	}
	return body.Data.Result, nil
}

// A real Prometheus scrapes `leasehold drill --metrics-addr` with the alert
// rules loaded: the stale-write alert fires during the drill (issue 16: it
// never did), and every dashboard query parses and answers with series the
// drill exported.
func TestPrometheusScrapesADrill(t *testing.T) {
	metricsAddr := freeAddr(t)
	alerts := repoFile(t, filepath.Join("deploy", "prometheus", "alerts.yml"))
	prom := startPrometheus(t, fmt.Sprintf(`global:
  scrape_interval: 500ms
  evaluation_interval: 500ms
rule_files: [%q]
scrape_configs:
  - job_name: drill
    static_configs:
      - targets: [%q]
`, alerts, metricsAddr))

	code, out, errOut := runMain(t, "drill", "--metrics-addr", metricsAddr, "--faults", "pause,outage,restart", "--outage", "2s", "--seed", "16")
	end := time.Now()
	if code != ExitOK {
		t.Fatalf("drill: exit %d\n%s\n%s", code, out, errOut)
	}
	ctx := t.Context()
	// The last scrape of the drill was within a scrape interval of its end.
	at := end.Add(-time.Second)

	series, err := prom.query(ctx, `leasehold_stale_writes_rejected_total{job="drill", locker="drill", resource="register"}`, at)
	if err != nil || len(series) != 1 {
		t.Fatalf("expected the stale-write series, got %v (%v)", series, err)
	}
	fired, err := prom.query(ctx, `max_over_time(ALERTS{alertname="LeaseholdStaleWritesRejected", alertstate="firing", job="drill"}[5m])`, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fired) == 0 {
		t.Errorf("LeaseholdStaleWritesRejected never fired during a drill that rejected stale writes:\n%s", out)
	}
	for _, alert := range []string{"LeaseholdStoreErrors", "LeaseholdLeasesLost"} {
		seen, err := prom.query(ctx, fmt.Sprintf(`max_over_time(ALERTS{alertname=%q, job="drill"}[5m])`, alert), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s pending or firing during the drill: %v", alert, len(seen) > 0)
	}

	exprs := dashboardQueries(t, "10s")
	if len(exprs) < 20 {
		t.Fatalf("expected at least 20 dashboard queries, got %d", len(exprs))
	}
	for title, expr := range exprs {
		res, err := prom.query(ctx, expr, at)
		if err != nil {
			t.Errorf("panel %s: %v", title, err)
			continue
		}
		if len(res) == 0 {
			t.Errorf("panel %s: %s answered no series from a drill", title, expr)
		}
	}
}

// dashboardQueries returns every panel query of deploy/grafana/leasehold.json
// by "panel title #n", with Grafana's variables replaced: all jobs,
// instances and lockers, and rateWindow for $__rate_interval.
func dashboardQueries(t *testing.T, rateWindow string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(repoFile(t, filepath.Join("deploy", "grafana", "leasehold.json")))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", rateWindow, "$job", ".*", "$instance", ".*", "$locker", ".*")
	exprs := make(map[string]string)
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatal(err)
			}
			walk(p.Panels)
			for i, tg := range p.Targets {
				exprs[fmt.Sprintf("%q #%d", p.Title, i+1)] = vars.Replace(tg.Expr)
			}
		}
	}
	walk(d.Panels)
	return exprs
}
