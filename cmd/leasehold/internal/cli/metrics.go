package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/prommetrics"
)

// startMetrics serves /metrics on addr (when not empty) with the leasehold
// series of an Observer it returns (nil when addr is empty), and returns the
// function that stops the server and waits for it.
func (a *App) startMetrics(addr, cmdName string) (leasehold.Observer, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	obs, err := prommetrics.New(reg, prommetrics.Options{ConstLabels: map[string]string{"command": cmdName}})
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, usage("--metrics-addr %q: cannot listen: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
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
	return obs, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
