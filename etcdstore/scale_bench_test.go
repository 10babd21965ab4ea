package etcdstore_test

import (
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/internal/benchkit"
)

var (
	scaleLeases = flag.String("scale.leases", "1000,10000", "BenchmarkScale: comma-separated numbers of held leases")
	scaleTTL    = flag.Duration("scale.ttl", 2*time.Second, "BenchmarkScale: lease TTL")
	scaleHold   = flag.Duration("scale.hold", 10*time.Second, "BenchmarkScale: how long the leases are held")
	scaleWait   = flag.Int("scale.waiters", 0, "BenchmarkScale: idle waiters (Acquire on held keys, one more Locker)")
	scaleLocks  = flag.Int("scale.lockers", 1, "BenchmarkScale: Lockers sharing the held leases")
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
	for _, f := range strings.Split(*scaleLeases, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("bad -scale.leases %q", *scaleLeases)
		}
		b.Run(fmt.Sprintf("N=%d/K=%d/P=%d", n, *scaleWait, *scaleLocks), func(b *testing.B) {
			cfg := benchkit.ScaleConfig{Leases: n, Waiters: min(*scaleWait, n), Lockers: *scaleLocks,
				Hold: *scaleHold, ServerPID: c.Members[0].PID(), Requests: proposals}
			r := benchkit.Scale(b, cfg, func(obs leasehold.Observer) (*leasehold.Locker, error) {
				st, err := etcdstore.New(c.Client(b), etcdstore.Options{Prefix: fmt.Sprintf("scale-%d/", n)})
				if err != nil {
					return nil, err
				}
				b.Cleanup(func() { _ = st.Close() })
				return leasehold.New(st, leasehold.Options{Name: "scale", TTL: *scaleTTL, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
			})
			r.Report(b)
		})
	}
}
