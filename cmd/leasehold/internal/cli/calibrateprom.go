package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"

	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"

	"github.com/leasehold/leasehold/calibrate"
)

// promSource is where `calibrate --prometheus` reads live numbers: the
// held-duration and renewal-latency histograms of one locker over a window.
type promSource struct {
	url, locker, window string
}

// promCalibration is what was read, for the output.
type promCalibration struct {
	URL        string  `json:"url"`
	Locker     string  `json:"locker"`
	Window     string  `json:"window"`
	Held       float64 `json:"held_count"`
	HeldP99MS  float64 `json:"held_p99_ms"`
	Renewals   float64 `json:"renewal_count"`
	RenewP99MS float64 `json:"renewal_p99_ms"`
	JitterFrom string  `json:"jitter_from"` // "renewal_p99" or "flag"
}

func (p *promSource) register(f *pflag.FlagSet) {
	f.StringVar(&p.url, "prometheus", "", "read the p99 held duration (and, unless --jitter, the renewal p99 as jitter) of --locker from the Prometheus at `URL` (HTTP API)")
	f.StringVar(&p.locker, "locker", "", "with --prometheus: the locker label to read")
	f.StringVar(&p.window, "window", "7d", "with --prometheus: the window the percentiles are taken over (Prometheus duration: 1h, 7d)")
}

// read sets in.P99 from the released leases' held durations and, unless
// jitterSet, in.Jitter from the renewals' round trips.
func (p *promSource) read(ctx context.Context, in *calibrate.Input, jitterSet bool) (*promCalibration, error) {
	if p.locker == "" {
		return nil, usage("--prometheus needs --locker NAME: the locker label of the series to read")
	}
	w, err := model.ParseDuration(p.window)
	if err != nil || w <= 0 {
		return nil, usage("--window %q: a Prometheus duration > 0, e.g. 1h or 7d", p.window)
	}
	base, err := url.Parse(p.url)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, usage("--prometheus %q: an http:// or https:// URL of a Prometheus server", storeurl.Describe(p.url))
	}
	q := promQuerier{base: base, at: time.Now()}
	sel := "locker=" + strconv.Quote(p.locker)
	held := fmt.Sprintf(`leasehold_held_seconds_%%s{%s, reason="released"}`, sel)
	renew := fmt.Sprintf(`leasehold_renew_seconds_%%s{%s}`, sel)
	out := &promCalibration{URL: storeurl.Describe(p.url), Locker: p.locker, Window: w.String(), JitterFrom: "flag"}
	if out.Held, err = q.count(ctx, fmt.Sprintf(held, "count"), w); err != nil {
		return nil, err
	}
	if out.Held < 1 {
		return nil, Exit(ExitFailure, "no released %q leases in the last %s in Prometheus: check --locker (the locker label) and --window", p.locker, w)
	}
	p99, err := q.p99(ctx, fmt.Sprintf(held, "bucket"), w)
	if err != nil {
		return nil, err
	}
	in.P99, out.HeldP99MS = p99, ms(p99)
	if out.Renewals, err = q.count(ctx, fmt.Sprintf(renew, "count"), w); err != nil {
		return nil, err
	}
	if out.Renewals >= 1 {
		r99, err := q.p99(ctx, fmt.Sprintf(renew, "bucket"), w)
		if err != nil {
			return nil, err
		}
		out.RenewP99MS = ms(r99)
		if !jitterSet {
			in.Jitter, out.JitterFrom = r99, "renewal_p99"
		}
	}
	if !jitterSet && out.JitterFrom != "renewal_p99" {
		return nil, usage("no %q renewals in the last %s to take the jitter from: pass --jitter D", p.locker, w)
	}
	return out, nil
}

// promQuerier runs instant queries at one time through the HTTP API
// (/api/v1/query).
type promQuerier struct {
	base *url.URL
	at   time.Time
}

// scalar returns the value of the first series of a vector answer, 0 when
// the vector is empty.
func (q promQuerier) scalar(ctx context.Context, expr string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := q.base.JoinPath("api", "v1", "query")
	u.RawQuery = url.Values{"query": {expr}, "time": {strconv.FormatFloat(float64(q.at.UnixMilli())/1000, 'f', 3, 64)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, Exit(ExitFailure, "prometheus: %v", storeurl.RedactError(err, q.base.String()))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, Exit(ExitFailure, "prometheus: %v", storeurl.RedactError(err, q.base.String()))
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, Exit(ExitFailure, "prometheus: %s: HTTP %d, not an API answer: %v", expr, resp.StatusCode, err)
	}
	switch {
	case body.Status != "success":
		return 0, Exit(ExitFailure, "prometheus: %s: %s", expr, body.Error)
	case body.Data.ResultType != "vector":
		return 0, Exit(ExitFailure, "prometheus: %s: expected a vector, got %s", expr, body.Data.ResultType)
	case len(body.Data.Result) == 0:
		return 0, nil
	}
	str, _ := body.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(strings.TrimSpace(str), 64)
	if err != nil {
		return 0, Exit(ExitFailure, "prometheus: %s: value %q: %v", expr, str, err)
	}
	return v, nil
}

// count is how many observations a histogram got over w.
func (q promQuerier) count(ctx context.Context, series string, w model.Duration) (float64, error) {
	return q.scalar(ctx, fmt.Sprintf("sum(increase(%s[%s]))", series, w))
}

// p99 is the 99th percentile of a histogram's observations over w.
func (q promQuerier) p99(ctx context.Context, buckets string, w model.Duration) (time.Duration, error) {
	expr := fmt.Sprintf("histogram_quantile(0.99, sum by (le) (increase(%s[%s])))", buckets, w)
	v, err := q.scalar(ctx, expr)
	if err != nil {
		return 0, err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, Exit(ExitFailure, "prometheus: %s: no usable percentile (%v); the top bucket may be +Inf: widen the histogram's buckets", expr, v)
	}
	return time.Duration(v * float64(time.Second)).Round(time.Millisecond / 10), nil
}

func printPromSource(a *App, p *promCalibration) {
	fmt.Fprintf(a.Stdout, "prometheus  %s, locker %q over %s: %.0f released leases, held p99 %s; %.0f renewals, p99 %s (jitter from %s)\n",
		p.URL, p.Locker, p.Window, p.Held, human(time.Duration(p.HeldP99MS*float64(time.Millisecond))),
		p.Renewals, human(time.Duration(p.RenewP99MS*float64(time.Millisecond))), p.JitterFrom)
}
