package doctor

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/testredis"
)

func configSet(t *testing.T, c redis.Cmdable, name, value string) {
	t.Helper()
	if err := c.ConfigSet(t.Context(), name, value).Err(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", name, value, err)
	}
}

// waitReplicas waits until the master of c reports n connected replicas.
func waitReplicas(t *testing.T, c *redis.Client, n int) {
	t.Helper()
	want := "connected_slaves:" + string(rune('0'+n))
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(c.Info(t.Context(), "replication").Val(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("expected %s, got %q", want, c.Info(t.Context(), "replication").Val())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A writable replica FAILs, a master that would become one WARNs, and
// replica-read-only yes passes; a master with a replica and no
// min-replicas-to-write WARNs and passes with it.
func TestRedisReplication(t *testing.T) {
	master := testredis.Start(t)
	mc := master.Client(t)
	host, port, _ := strings.Cut(master.Addr, ":")
	replica := testredis.Start(t, "--replicaof", host, port, "--replica-read-only", "no")
	rc := replica.Client(t)
	waitReplicas(t, mc, 1)

	wantStatus(t, checkRedis(t, rc, Options{}), "redis_replica_read_only", Fail)
	configSet(t, rc, "replica-read-only", "yes")
	wantStatus(t, checkRedis(t, rc, Options{}), "redis_replica_read_only", OK)

	configSet(t, mc, "replica-read-only", "no")
	rs := checkRedis(t, mc, Options{})
	wantStatus(t, rs, "redis_replica_read_only", Warn)
	r := wantStatus(t, rs, "redis_failover", Warn)
	if !strings.Contains(r.Seen, "1 connected replica") {
		t.Fatalf("expected the replica seen, got %q", r.Seen)
	}
	configSet(t, mc, "replica-read-only", "yes")
	configSet(t, mc, "min-replicas-to-write", "1")
	rs = checkRedis(t, mc, Options{})
	wantStatus(t, rs, "redis_replica_read_only", OK)
	wantStatus(t, rs, "redis_failover", OK)
}

// No persistence WARNs; appendonly yes passes.
func TestRedisPersistence(t *testing.T) {
	c := testredis.Start(t).Client(t)
	wantStatus(t, checkRedis(t, c, Options{}), "redis_persistence", Warn)
	configSet(t, c, "appendonly", "yes")
	wantStatus(t, checkRedis(t, c, Options{}), "redis_persistence", OK)
	// Turning AOF on forks a rewrite child that writes into the server's
	// directory; killed at cleanup, the server leaves it writing there while
	// the directory is removed ("directory not empty"). Let it finish.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		info, err := c.Info(t.Context(), "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "aof_rewrite_in_progress:0") && strings.Contains(info, "aof_rewrite_scheduled:0") {
			return
		}
	}
	t.Fatal("the AOF rewrite did not finish within 10s")
}

// This host's clock set 10 s behind the server's WARNs; the true clock
// passes.
func TestRedisClock(t *testing.T) {
	c := testredis.Start(t).Client(t)
	wantStatus(t, checkRedis(t, c, Options{}), "redis_clock", OK)
	behind := func() time.Time { return time.Now().Add(-10 * time.Second) }
	r := wantStatus(t, checkRedis(t, c, Options{Now: behind}), "redis_clock", Warn)
	if !strings.HasPrefix(r.Seen, "offset 9.9") && !strings.HasPrefix(r.Seen, "offset 10") {
		t.Fatalf("expected an offset of 10s, got %q", r.Seen)
	}
}

// Under the service ACL of redisstore/README.md (no CONFIG, no INFO) the
// checks that need them SKIP and name the right; the clock check still
// runs (TIME is granted). A user allowed INFO but not CONFIG still gets
// the eviction verdict, from INFO memory.
func TestRedisRestrictedUser(t *testing.T) {
	srv := testredis.Start(t, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
	admin := srv.Client(t)
	ctx := t.Context()
	for _, acl := range [][]any{
		// The service user's ACL of redisstore/README.md.
		append([]any{"ACL", "SETUSER", "svc", "on", ">svc-pass"}, anys(strings.Fields("resetkeys ~leasehold:* resetchannels &leasehold:* -@all "+
			"+evalsha +eval +get +set +pexpire +pttl +del +exists +hget +hgetall +hset +hdel +hincrby +zadd +zcard +zrange +zrank +zrem +publish +spublish +time +scan "+
			"+subscribe +unsubscribe +ssubscribe +sunsubscribe +ping"))...),
		{"ACL", "SETUSER", "info", "on", ">info-pass", "~leasehold:*", "-@all", "+info", "+time", "+ping"},
	} {
		if err := admin.Do(ctx, acl...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	user := func(name, pass string) *redis.Client {
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Username: name, Password: pass})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	rs := checkRedis(t, user("svc", "svc-pass"), Options{})
	for _, check := range []string{"redis_eviction", "redis_replica_read_only", "redis_failover", "redis_persistence", "redis_cluster_coverage"} {
		r := wantStatus(t, rs, check, Skip)
		if !strings.Contains(r.Fix, "+config|get") || !strings.Contains(r.Seen, "NOPERM") {
			t.Fatalf("%s: expected the refusal and the missing right, got %+v", check, r)
		}
	}
	wantStatus(t, rs, "redis_clock", OK)

	rs = checkRedis(t, user("info", "info-pass"), Options{})
	wantStatus(t, rs, "redis_eviction", Fail)
	wantStatus(t, rs, "redis_cluster_coverage", OK)
	wantStatus(t, rs, "redis_persistence", Skip)
}

// Each master of a Cluster is checked; cluster-require-full-coverage no
// WARNs.
func TestRedisCluster(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	c := cl.Client(t)
	rs := checkRedis(t, c, Options{})
	n := 0
	for _, r := range rs {
		if r.Check == "redis_cluster_coverage" {
			n++
			if r.Status != OK {
				t.Fatalf("expected OK, got %+v", r)
			}
		}
	}
	if n != 3 {
		t.Fatalf("expected one coverage result per master (3), got %d: %+v", n, rs)
	}
	configSet(t, cl.Nodes[0].Client(t), "cluster-require-full-coverage", "no")
	r := wantStatus(t, checkRedis(t, cl.Nodes[0].Client(t), Options{}), "redis_cluster_coverage", Warn)
	if !strings.Contains(r.Seen, "cluster-require-full-coverage no") {
		t.Fatalf("expected the setting seen, got %q", r.Seen)
	}
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
