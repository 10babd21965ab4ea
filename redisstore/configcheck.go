package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
)

var _ leasehold.ConfigChecker = (*Store)(nil)

// CheckConfig implements leasehold.ConfigChecker: it reports a maxmemory
// with an evicting policy (check "redis_eviction"), under which Redis can
// delete a held lock's key, read from INFO memory in one round trip. The
// service ACL of the package doc does not grant INFO: then it returns an
// error wrapping leasehold.ErrConfigNotChecked that names the right (and
// the server's ACL LOG records one denied INFO). On a Cluster it reads the
// node the client picks.
func (s *Store) CheckConfig(ctx context.Context) ([]leasehold.ConfigWarning, error) {
	p := s.c.Pipeline()
	info := p.Info(ctx, "memory")
	_, _ = p.Exec(ctx) // the command's error is read below
	raw, err := info.Result()
	var re redis.Error
	switch {
	case errors.As(err, &re):
		return nil, fmt.Errorf("%w: the Redis user may not run INFO (grant +info, or run `leasehold doctor` as an operator): %v", leasehold.ErrConfigNotChecked, firstLine(err.Error()))
	case err != nil:
		return nil, fmt.Errorf("redisstore: check settings: %w", err)
	}
	if w, ok := EvictionWarning(infoField(raw, "maxmemory"), infoField(raw, "maxmemory_policy")); ok {
		return []leasehold.ConfigWarning{w}, nil
	}
	return nil, nil
}

// EvictionWarning returns the warning for a server with maxmemory and
// maxmemory-policy as given (the values of CONFIG GET), and whether they
// let Redis evict lock keys: a maxmemory other than 0 with any policy but
// noeviction.
func EvictionWarning(maxmemory, policy string) (leasehold.ConfigWarning, bool) {
	if maxmemory == "" || maxmemory == "0" || policy == "" || policy == "noeviction" {
		return leasehold.ConfigWarning{}, false
	}
	return leasehold.ConfigWarning{
		Check: "redis_eviction",
		Seen:  fmt.Sprintf("maxmemory %s, maxmemory-policy %s", maxmemory, policy),
		Fix:   "CONFIG SET maxmemory-policy noeviction (and maxmemory-policy noeviction in redis.conf), or keep locks in a Redis of their own without maxmemory",
	}, true
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
