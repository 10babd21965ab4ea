package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// metrics is one command's registry and Observer, and the outputs that use
// them (a /metrics server, a recording); stop ends the outputs and waits.
type metrics struct {
	reg   *prometheus.Registry
	obs   *prommetrics.Observer
	stops []func()
}

// newMetrics returns a registry with the Go and process collectors and the
// leasehold series of an Observer labelled command=cmdName.
func newMetrics(cmdName string) (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	obs, err := prommetrics.New(reg, prommetrics.Options{ConstLabels: map[string]string{"command": cmdName}})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &metrics{reg: reg, obs: obs}, nil
}

// stop ends the outputs, last started first, and waits for them.
func (m *metrics) stop() {
	for i := len(m.stops) - 1; i >= 0; i-- {
		m.stops[i]()
	}
	m.stops = nil
}

// serve serves /metrics on addr until stop.
func (m *metrics) serve(a *App, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return usage("--metrics-addr %q: cannot listen: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	// A scraper reconnects in no time; an idle or slow client must not hold
	// a connection (and a goroutine) for the whole run.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(a.Stderr, "leasehold: metrics server: %v\n", err)
		}
	}()
	if a.verbose {
		fmt.Fprintf(a.Stderr, "leasehold: serving metrics on http://%s/metrics\n", ln.Addr())
	}
	m.stops = append(m.stops, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return nil
}

// record writes a scrape of the registry to file every interval until stop,
// and a last one then (prommetrics.Record).
func (m *metrics) record(a *App, file string, interval time.Duration) error {
	if interval <= 0 {
		return usage("--record-interval must be > 0, got %v", interval)
	}
	f, err := os.Create(file)
	if err != nil {
		return usage("--record-metrics: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := prommetrics.Record(ctx, m.reg, f, interval); err != nil {
			fmt.Fprintf(a.Stderr, "leasehold: --record-metrics: %v\n", err)
		}
	}()
	m.stops = append(m.stops, func() {
		cancel()
		<-done
		if err := f.Close(); err != nil {
			fmt.Fprintf(a.Stderr, "leasehold: --record-metrics: %v\n", err)
		}
	})
	return nil
}

// startMetrics serves /metrics on addr (when not empty) with the leasehold
// series of an Observer it returns (nil when addr is empty), and returns the
// function that stops the server and waits for it.
func (a *App) startMetrics(addr, cmdName string) (leasehold.Observer, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	m, err := newMetrics(cmdName)
	if err != nil {
		return nil, nil, err
	}
	if err := m.serve(a, addr); err != nil {
		return nil, nil, err
	}
	return m.obs, m.stop, nil
}
