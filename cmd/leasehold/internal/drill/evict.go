package drill

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// evicter is a backend whose server can be made to evict a lock's key under
// memory pressure.
type evicter interface {
	// evict makes the store evict key's lock and returns what it did;
	// errRestartSkipped says it could not.
	evict(ctx context.Context, key string) (string, error)
}

// injectEvict freezes a working replica right before its write (as the
// pause fault does), makes Redis evict the locks under memory pressure
// (maxmemory with volatile-ttl and a cache's writes: lock keys have the
// shortest TTLs, so they go first), hands the job to another replica,
// which finds the key free at once, and thaws the frozen holder once the
// job is written: its lease still looks valid to it, so it writes with its
// old fence and the fenced register rejects that write. The eviction is
// recorded as a moment the store lost its data (History.Restarts).
func (d *drill) injectEvict(ctx context.Context) string {
	ev, ok := d.be.(evicter)
	if !ok {
		return fmt.Sprintf("skipped: the eviction fault needs --store %s", StoreRedisServer)
	}
	r, pe, note := d.pauseHolder(ctx)
	if r == nil {
		return note
	}
	defer func() {
		if inc := r.current(); inc != nil {
			inc.proc.thaw()
		}
	}()
	key := groupKey
	if d.cfg.Workload == WorkloadJobs {
		key = jobKey(pe.job)
	}
	d.restarting.Store(true)
	d.rec.count(func(h *History) { h.Restarts = append(h.Restarts, d.rec.since()) })
	what, err := ev.evict(ctx, key)
	d.restarting.Store(false)
	if err != nil {
		return failedNote("evict", err)
	}
	start := time.Now()
	d.redeliver(pe.job, pe.replica)
	limit := 10*d.cfg.TTL + 2*d.cfg.WorkMax
	for !d.takenOver(pe) && time.Since(start) < limit {
		if !sleep(ctx, 2*time.Millisecond) {
			break
		}
	}
	if !d.takenOver(pe) {
		return fmt.Sprintf("%s; replica %d frozen before writing %s, which nobody took over", what, pe.replica, key)
	}
	return fmt.Sprintf("%s; replica %d, frozen before writing %s, was taken over after %v; thawed, it writes with its old fence",
		what, pe.replica, key, time.Since(start).Round(time.Millisecond))
}

// evict sets maxmemory to the memory in use with the volatile-ttl policy
// and writes 1 KiB cache entries with a one-hour TTL, 64 to a round trip (as
// a cache sharing the server would), until key's lock is gone; then it
// restores noeviction without a limit and deletes the cache. Lock keys have
// the shortest TTLs, so they are evicted first, long before they expire.
func (b *redisBackend) evict(ctx context.Context, key string) (string, error) {
	if b.server == nil {
		return "", fmt.Errorf("%w: the drill changes maxmemory only on a Redis it started (use --store %s)", errRestartSkipped, StoreRedisServer)
	}
	c := b.direct
	lock := b.obs.LockKey(key)
	pttl, err := c.PTTL(ctx, lock).Result()
	if err != nil {
		return "", err
	}
	if pttl <= 0 {
		return "", fmt.Errorf("the lock of %s was gone before the eviction", key)
	}
	used, err := infoInt(ctx, c, "memory", "used_memory")
	if err != nil {
		return "", err
	}
	before, err := infoInt(ctx, c, "stats", "evicted_keys")
	if err != nil {
		return "", err
	}
	cache := b.prefix + "cache:"
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = c.ConfigSet(rctx, "maxmemory-policy", "noeviction").Err()
		_ = c.ConfigSet(rctx, "maxmemory", "0").Err()
		deleteKeys(c, cache, 2*time.Second)
	}()
	start := time.Now()
	if err := c.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		return "", err
	}
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used, 10)).Err(); err != nil {
		return "", err
	}
	val := strings.Repeat("x", 1024)
	written := 0
	for c.Exists(ctx, lock).Val() == 1 {
		if written >= 64*1024 {
			return "", fmt.Errorf("the lock of %s survived 64 MiB of cache writes", key)
		}
		p := c.Pipeline()
		for range 64 {
			p.Set(ctx, cache+strconv.Itoa(written), val, time.Hour)
			written++
		}
		_, _ = p.Exec(ctx) // an OOM refusal is pressure too
	}
	took := time.Since(start)
	after, err := infoInt(ctx, c, "stats", "evicted_keys")
	if err != nil {
		return "", err
	}
	if after == before {
		return "", fmt.Errorf("the lock of %s went without an eviction (expired?)", key)
	}
	return fmt.Sprintf("maxmemory %d (the memory in use) with volatile-ttl: %d keys evicted in %v (%d KiB of cache writes), "+
		"the lock of %s among them with %v still to live", used, after-before, took.Round(time.Millisecond), written, key,
		pttl.Round(time.Millisecond)), nil
}

// infoInt reads one integer field of an INFO section.
func infoInt(ctx context.Context, c *redis.Client, section, field string) (int64, error) {
	raw, err := c.Info(ctx, section).Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(raw, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO %s has no %s", section, field)
}
