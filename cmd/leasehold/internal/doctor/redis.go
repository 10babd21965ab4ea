package doctor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/redisstore"
)

// Errors of Redis, matched with errors.Is.
var (
	// ErrUnavailable: the server did not answer PING.
	ErrUnavailable = errors.New("doctor: store unavailable")
	// ErrRefused: the server answered PING with an error (a wrong
	// password, a user without +ping).
	ErrRefused = errors.New("doctor: store refused the connection")
)

// Redis runs every Redis check against the server of client: on each
// master of a Cluster, on the master of a Sentinel client. CONFIG GET and
// INFO are what most checks read; a user allowed neither (the service ACL
// of redisstore/README.md) gets SKIP lines naming the rights. It returns an
// error wrapping ErrUnavailable or ErrRefused when a server does not answer
// PING.
func Redis(ctx context.Context, client redis.UniversalClient, o Options) ([]Result, error) {
	o = o.withDefaults()
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		return redisNode(ctx, client, "", o)
	}
	var (
		mu  sync.Mutex // ForEachMaster calls concurrently
		all []Result
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		rs, err := redisNode(ctx, n, n.Options().Addr, o)
		mu.Lock()
		defer mu.Unlock()
		all = append(all, rs...)
		return err
	})
	if err != nil {
		return nil, pingError(err)
	}
	return all, nil
}

func pingError(err error) error {
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) {
		return err
	}
	var re redis.Error
	if errors.As(err, &re) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// redisFacts is what the checks of one node read: CONFIG GET and INFO,
// each nil when the user may not run it.
type redisFacts struct {
	conf, info       map[string]string
	confErr, infoErr error
}

// redisConfigNames are the parameters the checks read with CONFIG GET.
var redisConfigNames = []string{"maxmemory", "maxmemory-policy", "replica-read-only", "min-replicas-to-write",
	"min-replicas-max-lag", "appendonly", "save", "cluster-enabled", "cluster-require-full-coverage"}

// readRedisFacts reads every CONFIG parameter and the INFO sections the
// checks need in one round trip (a pipeline: CONFIG GET of one parameter
// works on every Redis version).
func readRedisFacts(ctx context.Context, c redis.Cmdable) redisFacts {
	p := c.Pipeline()
	confs := make([]*redis.MapStringStringCmd, len(redisConfigNames))
	for i, n := range redisConfigNames {
		confs[i] = p.ConfigGet(ctx, n)
	}
	info := p.Info(ctx, "memory", "replication", "persistence", "cluster")
	_, _ = p.Exec(ctx) // each command's error is read below
	var f redisFacts
	f.conf = map[string]string{}
	for _, cmd := range confs {
		m, err := cmd.Result()
		if err != nil {
			f.conf, f.confErr = nil, err
			break
		}
		for k, v := range m {
			f.conf[k] = v
		}
	}
	raw, err := info.Result()
	f.infoErr = err
	if err == nil {
		f.info = parseInfo(raw)
	}
	return f
}

func parseInfo(raw string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(raw, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// get returns a CONFIG parameter, else the INFO field that carries the same
// value, and whether either was readable.
func (f redisFacts) get(conf, info string) (string, bool) {
	if v, ok := f.conf[conf]; ok {
		return v, true
	}
	if info != "" {
		if v, ok := f.info[info]; ok {
			return v, true
		}
	}
	return "", false
}

func redisNode(ctx context.Context, c redis.Cmdable, addr string, o Options) ([]Result, error) {
	if err := c.Ping(ctx).Err(); err != nil {
		if addr != "" {
			err = fmt.Errorf("%s: %w", addr, err)
		}
		return nil, pingError(err)
	}
	f := readRedisFacts(ctx, c)
	rs := []Result{
		redisEviction(f), redisReplicaWrites(f), redisReplication(f), redisPersistence(f), redisClusterCoverage(f),
		redisClock(ctx, c, o),
	}
	if addr != "" {
		for i := range rs {
			rs[i].Seen = addr + ": " + rs[i].Seen
		}
	}
	return rs, nil
}

// skipRedis is the SKIP result of a check whose reads were refused.
func skipRedis(check string, f redisFacts, right string) Result {
	err := f.confErr
	if err == nil {
		err = f.infoErr
	}
	seen := "cannot read the settings"
	if err != nil {
		seen += ": " + firstLine(err.Error())
	}
	return Result{Check: check, Status: Skip, Seen: seen,
		Fix: "run doctor as a user allowed " + right + " (the leasehold-ops user of docs/runbook.md is)"}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

const (
	rightConfig     = "+config|get"
	rightConfigInfo = "+config|get or +info"
)

// redisEviction fails when Redis may evict keys: a maxmemory with any
// policy but noeviction. INFO memory carries both values for a user that
// may not run CONFIG GET.
func redisEviction(f redisFacts) Result {
	const check = "redis_eviction"
	maxmem, ok1 := f.get("maxmemory", "maxmemory")
	policy, ok2 := f.get("maxmemory-policy", "maxmemory_policy")
	if !ok1 || !ok2 {
		return skipRedis(check, f, rightConfigInfo)
	}
	w, evicts := redisstore.EvictionWarning(maxmem, policy)
	if !evicts {
		return Result{Check: check, Status: OK, Seen: fmt.Sprintf("maxmemory %s, maxmemory-policy %s", maxmem, policy)}
	}
	why := "Redis evicts keys to stay under maxmemory"
	if strings.HasPrefix(policy, "volatile-") {
		why += ", and every lock key has a TTL, so this policy picks lock keys first"
	}
	return Result{Check: check, Status: Fail, Seen: w.Seen,
		Why: why + ": an evicted lock is taken by a second holder while the first still runs, and neither gets an error",
		Fix: w.Fix}
}

// redisReplicaWrites flags replica-read-only no: a replica that accepts
// writes can hand out a lock its master never sees.
func redisReplicaWrites(f redisFacts) Result {
	const check = "redis_replica_read_only"
	v, ok := f.conf["replica-read-only"]
	if !ok {
		return skipRedis(check, f, rightConfig)
	}
	role := f.info["role"]
	seen := "replica-read-only " + v
	if role != "" {
		seen += ", role " + role
	}
	if v != "no" {
		return Result{Check: check, Status: OK, Seen: seen}
	}
	r := Result{Check: check, Status: Warn, Seen: seen,
		Why: "once this server is a replica (after a failover) it accepts lock writes that its master never sees and that the next resync drops, so two clients can hold one lock",
		Fix: "CONFIG SET replica-read-only yes (and replica-read-only yes in redis.conf)"}
	if role == "slave" {
		r.Status = Fail
		r.Why = "this replica accepts lock writes that its master never sees and that the next resync drops, so two clients can hold one lock"
	}
	return r
}

// redisReplication warns about a master with replicas and no
// min-replicas-to-write.
func redisReplication(f redisFacts) Result {
	const check = "redis_failover"
	role, ok1 := f.info["role"]
	minRep, ok2 := f.conf["min-replicas-to-write"]
	if !ok1 || !ok2 {
		return skipRedis(check, f, "+config|get and +info")
	}
	replicas, _ := strconv.Atoi(f.info["connected_slaves"])
	seen := fmt.Sprintf("role %s, %d connected replica(s), min-replicas-to-write %s", role, replicas, minRep)
	if role == "master" && replicas == 0 {
		return Result{Check: check, Status: OK, Seen: seen + " (no replication)"}
	}
	if minRep != "0" {
		return Result{Check: check, Status: OK, Seen: seen + ", min-replicas-max-lag " + f.conf["min-replicas-max-lag"]}
	}
	return Result{Check: check, Status: Warn, Seen: seen,
		Why: "replication is asynchronous: a failover to a replica that missed the latest acquire gives the lock to a second holder (docs/failover.md measured up to about a second of two holders), and without min-replicas-to-write a partitioned master keeps granting locks the new master never sees",
		Fix: "min-replicas-to-write 1 and min-replicas-max-lag 10 in redis.conf (CONFIG SET min-replicas-to-write 1), and fence the protected writes"}
}

// redisPersistence warns about a server that keeps nothing across a
// restart.
func redisPersistence(f redisFacts) Result {
	const check = "redis_persistence"
	aof, ok1 := f.conf["appendonly"]
	save, ok2 := f.conf["save"]
	if !ok1 || !ok2 {
		return skipRedis(check, f, rightConfig)
	}
	seen := fmt.Sprintf("appendonly %s, save %q", aof, save)
	if aof == "yes" {
		return Result{Check: check, Status: OK, Seen: seen}
	}
	r := Result{Check: check, Status: Warn, Seen: seen,
		Why: "a restart loses every lock (or every lock taken since the last snapshot), so a second holder can acquire while the first runs until its next renewal; fences stay ordered",
		Fix: "appendonly yes and appendfsync everysec in redis.conf (CONFIG SET appendonly yes)"}
	return r
}

// redisClusterCoverage reports cluster-require-full-coverage on a Cluster
// node.
func redisClusterCoverage(f redisFacts) Result {
	const check = "redis_cluster_coverage"
	enabled, ok := f.get("cluster-enabled", "cluster_enabled")
	if !ok {
		return skipRedis(check, f, rightConfigInfo)
	}
	if enabled != "yes" && enabled != "1" {
		return Result{Check: check, Status: OK, Seen: "not a Cluster"}
	}
	v, ok := f.conf["cluster-require-full-coverage"]
	if !ok {
		return skipRedis(check, f, rightConfig)
	}
	seen := "cluster-require-full-coverage " + v
	if v != "no" {
		return Result{Check: check, Status: OK, Seen: seen}
	}
	return Result{Check: check, Status: Warn, Seen: seen,
		Why: "the Cluster keeps serving the slots it still covers while others have no master, so a lock's availability depends on its key's slot and a partial outage is easy to miss",
		Fix: "cluster-require-full-coverage yes in redis.conf (CONFIG SET cluster-require-full-coverage yes)"}
}

// redisClock compares TIME with this host's clock. The service ACL allows
// TIME (the fence floor reads it).
func redisClock(ctx context.Context, c redis.Cmdable, o Options) Result {
	const check = "redis_clock"
	before := o.Now()
	server, err := c.Time(ctx).Result()
	after := o.Now()
	if err != nil {
		return Result{Check: check, Status: Skip, Seen: "TIME: " + firstLine(err.Error()), Fix: "run doctor as a user allowed +time"}
	}
	return clockResult(check, "Redis", "run NTP (chrony or systemd-timesyncd) on this host and the Redis server, slewing rather than stepping the clock", o, before, server, after)
}
