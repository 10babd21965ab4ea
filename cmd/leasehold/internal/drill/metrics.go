package drill

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold"
)

// MetricsOptions are the drill's metrics flags, passed to
// CommandOptions.Metrics.
type MetricsOptions struct {
	// Addr serves Prometheus /metrics there while the drill runs
	// (--metrics-addr); "" for none.
	Addr string
	// RecordFile receives timestamped scrapes of the metrics every
	// RecordInterval while the drill runs (--record-metrics); "" for none.
	RecordFile     string
	RecordInterval time.Duration
}

// seriesIniter is what the Prometheus adapter offers: a locker's series
// created at zero before its first event, so the first one shows in
// increase() and the alerts see it.
type seriesIniter interface {
	Init(locker string, resources ...string)
}

// initSeries creates the series of every locker the drill runs (the
// replicas) and of its fenced register, when obs can.
func initSeries(obs leasehold.Observer, cfg Config) {
	in, ok := obs.(seriesIniter)
	if !ok {
		return
	}
	for i := range cfg.Replicas {
		in.Init(replicaName(i))
	}
	in.Init(registerName, registerResource)
}

// The names the drill's lockers and fenced register report under (as
// newIncarnation and the registers name them).
const (
	registerName     = "drill"
	registerResource = "register"
)

func replicaName(id int) string { return fmt.Sprintf("replica-%d", id) }
