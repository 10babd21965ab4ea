package etcdstore_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/internal/testetcd"
)

func TestSmoke(t *testing.T) {
	start := time.Now()
	c := testetcd.Start(t)
	t.Logf("single member up in %v", time.Since(start))
	s, err := etcdstore.New(c.Client(t), etcdstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g, err := s.Acquire(t.Context(), "a", "tok", time.Second)
	t.Logf("%+v %v", g, err)
	g, err = s.Acquire(t.Context(), "a", "tok2", time.Second)
	t.Logf("%+v %v", g, err)
	info, err := s.Inspect(t.Context(), "a")
	t.Logf("%+v %v", info, err)
}

func TestSmokeCluster(t *testing.T) {
	start := time.Now()
	c := testetcd.StartCluster(t, 3)
	t.Logf("cluster up in %v", time.Since(start))
	l := c.Leader(5 * time.Second)
	start = time.Now()
	c.Kill(l)
	t.Logf("killed leader %d in %v", l, time.Since(start))
	nl := c.Leader(10 * time.Second)
	t.Logf("new leader %d after %v", nl, time.Since(start))
	start = time.Now()
	c.Restart(l)
	t.Logf("restarted in %v", time.Since(start))
}
