// Package testetcd starts etcd members for the cmd module's tests: a thin
// testing wrapper over etcdproc (the `etcd` binary from PATH, the launcher the
// drill uses too), stopped in tb.Cleanup. The etcdstore module's own tests
// embed an etcd server instead (etcdstore/internal/testetcd); this module
// must not link one.
package testetcd

import (
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/etcdproc"
)

// Cluster is a running single-member etcd.
type Cluster struct {
	*etcdproc.Server
}

// Start runs a single-member etcd and stops it in tb.Cleanup.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	s, err := etcdproc.Start(tb.Context())
	if err != nil {
		tb.Fatalf("testetcd: %v", err)
	}
	tb.Cleanup(s.Close)
	return &Cluster{Server: s}
}

// Endpoints returns the client URLs.
func (c *Cluster) Endpoints() []string { return []string{c.Endpoint()} }

// Client returns an etcd client for the member, closed in tb.Cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("testetcd: client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// LeakWait is how long VerifyTestMain waits for goroutines to end after the
// tests: etcd client connections close asynchronously.
const LeakWait = 10 * time.Second

// VerifyTestMain runs the tests, then checks with goleak that no goroutine is
// left, waiting up to LeakWait for stragglers instead of ignoring any
// goroutine by name.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(LeakWait)
		for {
			err := goleak.Find(opts...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: goroutines left %v after the tests: %v\n", LeakWait, err)
				code = 1
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.Exit(code)
}
