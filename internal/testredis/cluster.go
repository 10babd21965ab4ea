package testredis

import (
	"context"
	"crypto/tls"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters without replicas on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n (≥ 3) cluster-enabled redis-servers, joins them with
// `redis-cli --cluster create`, waits until every node reports
// cluster_state:ok, and stops them in t.Cleanup.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	return startCluster(tb, n, nil)
}

// StartClusterTLS is StartCluster with TLS only, on the client and the
// cluster bus: every node serves certFile and keyFile (signed by caFile) and
// asks no client certificate.
func StartClusterTLS(tb testing.TB, n int, caFile, certFile, keyFile string) *Cluster {
	tb.Helper()
	return startCluster(tb, n, &[3]string{caFile, certFile, keyFile})
}

func startCluster(tb testing.TB, n int, tlsFiles *[3]string) *Cluster {
	tb.Helper()
	if n < 3 {
		tb.Fatalf("testredis: a cluster needs at least 3 masters, got %d", n)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatalf("redis-cli not found: run `make test` or scripts/install-test-deps.sh (Debian package redis-tools)")
	}
	c := &Cluster{}
	var cliTLS []string
	var clientTLS *tls.Config
	for range n {
		args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(FreePort(tb))}
		if tlsFiles == nil {
			c.Nodes = append(c.Nodes, Start(tb, args...))
			continue
		}
		args = append(args, "--tls-cluster", "yes", "--tls-ca-cert-file", tlsFiles[0])
		c.Nodes = append(c.Nodes, StartTLS(tb, tlsFiles[1], tlsFiles[2], args...))
	}
	if tlsFiles != nil {
		cliTLS = []string{"--tls", "--cacert", tlsFiles[0]}
		// Readiness only: the tests check the certificates (a node may
		// serve one for another host name on purpose).
		clientTLS = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // see above
	}
	args := append(append([]string{"--cluster", "create"}, c.Addrs()...), cliTLS...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(cctx, cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		nc := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: s.Addr, TLSConfig: clientTLS})
		for {
			info, err := nc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = nc.Close()
				tb.Fatalf("cluster node %s not ok after 20s: %v %s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = nc.Close()
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr
	}
	return out
}

// Client returns a go-redis cluster client, closed in t.Cleanup.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: c.Addrs()})
	tb.Cleanup(func() { _ = cc.Close() })
	if err := cc.ForEachShard(context.Background(), func(ctx context.Context, s *redis.Client) error {
		return s.Ping(ctx).Err()
	}); err != nil {
		tb.Fatalf("ping cluster %v: %v", c.Addrs(), err)
	}
	return cc
}
