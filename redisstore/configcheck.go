package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
)

var _ driver.ConfigChecker = (*Store)(nil)

// ErrEvicted is wrapped, beside driver.ErrNotOwned, by a renewal that
// found its lock gone after Redis evicted keys (INFO's evicted_keys rose
// since the store last read it): the lock was most likely evicted under
// maxmemory, and the fix is maxmemory-policy noeviction (leasehold doctor,
// check redis_eviction). Only a user allowed INFO gets it.
var ErrEvicted = errors.New("redisstore: Redis evicted keys (maxmemory) while the lock was held")

// CheckConfig implements driver.ConfigChecker: it reports a maxmemory
// with an evicting policy (check "redis_eviction"), under which Redis can
// delete a held lock's key, read from INFO memory in one round trip. The
// service ACL of README.md does not grant INFO: then it returns an
// error wrapping driver.ErrConfigNotChecked that names the right (and
// the server's ACL LOG records one denied INFO). On a Cluster it reads the
// node the client picks.
func (s *Store) CheckConfig(ctx context.Context) ([]driver.ConfigWarning, error) {
	raw, err := s.serverInfo(ctx)
	var re redis.Error
	switch {
	case errors.As(err, &re):
		return nil, fmt.Errorf("%w: the Redis user may not run INFO (grant +info, or run `leasehold doctor` as an operator): %v", driver.ErrConfigNotChecked, firstLine(err.Error()))
	case err != nil:
		return nil, fmt.Errorf("redisstore: check settings: %w", err)
	}
	s.sawEvicted(raw)
	if w, ok := EvictionWarning(infoField(raw, "maxmemory"), infoField(raw, "maxmemory_policy")); ok {
		return []driver.ConfigWarning{w}, nil
	}
	return nil, nil
}

// EvictionWarning returns the warning for a server with maxmemory and
// maxmemory-policy as given (the values of CONFIG GET), and whether they
// let Redis evict lock keys: a maxmemory other than 0 with any policy but
// noeviction.
func EvictionWarning(maxmemory, policy string) (driver.ConfigWarning, bool) {
	if maxmemory == "" || maxmemory == "0" || policy == "" || policy == "noeviction" {
		return driver.ConfigWarning{}, false
	}
	return driver.ConfigWarning{
		Check: "redis_eviction",
		Seen:  fmt.Sprintf("maxmemory %s, maxmemory-policy %s", maxmemory, policy),
		Fix:   "CONFIG SET maxmemory-policy noeviction (and maxmemory-policy noeviction in redis.conf), or keep locks in a Redis of their own without maxmemory",
	}, true
}

// serverInfo reads INFO memory and stats, through a pipeline (Client has no
// Info of its own).
func (s *Store) serverInfo(ctx context.Context) (string, error) {
	p := s.c.Pipeline()
	info := p.Info(ctx, "memory", "stats")
	_, _ = p.Exec(ctx) // the command's error is read below
	return info.Result()
}

// sawEvicted records evicted_keys of an INFO reply and reports whether it
// rose since the last one.
func (s *Store) sawEvicted(raw string) bool {
	n, err := strconv.ParseInt(infoField(raw, "evicted_keys"), 10, 64)
	if err != nil {
		return false
	}
	return s.evictedSeen.Swap(n+1) < n+1
}

// lost is the error of a renewal that found its lock gone: ErrNotOwned,
// with ErrEvicted when Redis evicted keys since the store last looked (one
// INFO, only on this path and only when an earlier INFO was allowed).
func (s *Store) lost(ctx context.Context) error {
	if s.evictedSeen.Load() == 0 {
		return driver.ErrNotOwned
	}
	raw, err := s.serverInfo(ctx)
	if err != nil || !s.sawEvicted(raw) {
		return driver.ErrNotOwned
	}
	return fmt.Errorf("%w: %w", driver.ErrNotOwned, ErrEvicted)
}

func infoField(raw, name string) string {
	for _, line := range strings.Split(raw, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
