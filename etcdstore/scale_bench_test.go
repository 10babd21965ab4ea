package etcdstore_test

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/internal/benchkit"
)

// BenchmarkScale holds N leases from P Lockers on a real etcd member (a
// process; TTL 2 s) while K goroutines of one more Locker wait for some of
// the keys, and reports heap per lease and per waiter, raft proposals
// committed (as requests/s) and renewals per second, client and etcd CPU
// (from /proc/PID/stat) and the leases that ended before Close. Each Locker
// has its own Store (client). One run per N whatever -benchtime says:
//
//	go test -run '^$' -bench Scale ./etcdstore/ -args -scale.leases 10000 -scale.waiters 1000
func BenchmarkScale(b *testing.B) {
	c := testetcd.Start(b)
	proposals := func() int64 { return int64(c.Metric(b, 0, "etcd_server_proposals_committed_total")) }
	for _, cfg := range benchkit.ScaleRuns(b) {
		b.Run(cfg.Name(), func(b *testing.B) {
			cfg.ServerPID, cfg.Requests = c.Members[0].PID(), proposals
			r := benchkit.Scale(b, cfg, func(obs leasehold.Observer) (*leasehold.Locker, error) {
				st, err := etcdstore.New(c.Client(b), etcdstore.Options{Prefix: fmt.Sprintf("scale-%d/", cfg.Leases)})
				if err != nil {
					return nil, err
				}
				b.Cleanup(func() { _ = st.Close() })
				return leasehold.New(st, leasehold.Options{Name: "scale", TTL: *benchkit.ScaleTTL, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
			})
			r.Report(b)
		})
	}
}
