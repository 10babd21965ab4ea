package cli

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// calibrate --prometheus reads the held-duration and renewal histograms of a
// locker from a real Prometheus that scraped them, and computes the TTL.
func TestCalibrateFromPrometheus(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := prommetrics.New(reg, prommetrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	obs.Init("approval")
	exporter := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer exporter.Close()
	prom := startPrometheus(t, fmt.Sprintf(`global:
  scrape_interval: 200ms
scrape_configs:
  - job_name: app
    static_configs:
      - targets: [%q]
`, strings.TrimPrefix(exporter.URL, "http://")))
	// Wait for the series at zero, so the observations below are an
	// increase within the window.
	count := `sum(leasehold_held_seconds_count{locker="approval"})`
	waitFor(t, func() bool { r, err := prom.query(t.Context(), count, time.Time{}); return err == nil && len(r) == 1 })

	// 98 leases held 0.5 s, 2 held 25 s: with the default buckets the p99
	// falls in (10 s, 30 s], halfway: 20 s. Renewals all 20 ms: the p99 is
	// in (10 ms, 25 ms], at 99/100 of it: 24.85 ms. Leases that ended
	// otherwise than by release do not count.
	for i := range 100 {
		d := 500 * time.Millisecond
		if i < 2 {
			d = 25 * time.Second
		}
		obs.Observe(leasehold.Event{Kind: leasehold.EventHeld, Locker: "approval", Duration: d, Err: leasehold.ErrLeaseReleased})
		obs.Observe(leasehold.Event{Kind: leasehold.EventRenewed, Locker: "approval", Duration: 20 * time.Millisecond})
	}
	obs.Observe(leasehold.Event{Kind: leasehold.EventHeld, Locker: "approval", Duration: time.Hour, Err: leasehold.ErrLeaseLost})
	waitFor(t, func() bool {
		r, err := prom.query(t.Context(), count, time.Time{})
		return err == nil && len(r) == 1 && r[0].Value[1] == "101"
	})
	time.Sleep(500 * time.Millisecond) // a few more scrapes

	code, out, errOut := runMain(t, "calibrate", "--prometheus", prom.url, "--locker", "approval", "--window", "1h", "--guard", "1s", "--slo", "30s", "--json")
	if code != ExitOK {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	var j calibrateJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// increase() extrapolates to the window: about 100, often more.
	if j.Prometheus == nil || j.Prometheus.Held < 99 || j.Prometheus.Held > 150 || j.Prometheus.JitterFrom != "renewal_p99" {
		t.Fatalf("unexpected source: %+v", j.Prometheus)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if got < want*0.99 || got > want*1.01 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("p99", j.Inputs.P99MS, 20000)
	near("jitter", j.Inputs.JitterMS, 24.85)
	near("ttl", j.TTLMS, 20000+24.85+1000)
	if j.Verdict != "meets_slo" {
		t.Errorf("verdict %q, want meets_slo: %s", j.Verdict, out)
	}

	// Text output names the source; a wrong locker or no Prometheus fail
	// with a message.
	code, out, _ = runMain(t, "calibrate", "--prometheus", prom.url, "--locker", "approval", "--window", "1h", "--guard", "1s", "--jitter", "2s")
	if code != ExitOK || !strings.Contains(out, `locker "approval"`) || !strings.Contains(out, "jitter from flag") || !strings.Contains(out, "p99 20s") {
		t.Errorf("text output: exit %d\n%s", code, out)
	}
	code, _, errOut = runMain(t, "calibrate", "--prometheus", prom.url, "--locker", "nope", "--guard", "1s")
	if code != ExitFailure || !strings.Contains(errOut, `no released "nope" leases`) {
		t.Errorf("unknown locker: exit %d: %s", code, errOut)
	}
	code, _, errOut = runMain(t, "calibrate", "--prometheus", "http://127.0.0.1:1", "--locker", "approval", "--guard", "1s")
	if code != ExitFailure || !strings.Contains(errOut, "prometheus:") {
		t.Errorf("unreachable Prometheus: exit %d: %s", code, errOut)
	}
	for _, args := range [][]string{
		{"--prometheus", prom.url, "--guard", "1s"},
		{"--prometheus", prom.url, "--locker", "approval", "--guard", "1s", "--window", "soon"},
		{"--prometheus", prom.url, "--locker", "approval", "--p99", "1s", "--guard", "1s"},
		{"--prometheus", prom.url, "--locker", "approval"},
		{"--prometheus", "ftp://x", "--locker", "approval", "--guard", "1s"},
	} {
		if code, _, errOut := runMain(t, append([]string{"calibrate"}, args...)...); code != ExitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, ExitUsage, errOut)
		}
	}
}
