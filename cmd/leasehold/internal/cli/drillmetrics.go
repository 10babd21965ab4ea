package cli

import (
	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/drill"
)

// drillMetrics is the drill's metrics hook: an Observer whose series are
// served on --metrics-addr and recorded to --record-metrics, whichever are
// given (nil when neither is), and the function that stops both.
func (a *App) drillMetrics(o drill.MetricsOptions) (leasehold.Observer, func(), error) {
	if o.Addr == "" && o.RecordFile == "" {
		return nil, func() {}, nil
	}
	m, err := newMetrics("drill")
	if err != nil {
		return nil, nil, err
	}
	if o.Addr != "" {
		if err := m.serve(a, o.Addr); err != nil {
			return nil, nil, err
		}
	}
	if o.RecordFile != "" {
		if err := m.record(a, o.RecordFile, o.RecordInterval); err != nil {
			m.stop()
			return nil, nil, err
		}
	}
	return m.obs, m.stop, nil
}
