package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
)

// List implements driver.Inspector with SCAN MATCH over the store's key
// space; on a Cluster it scans every master. It is an operator's tool: its
// cost grows with the number of keys in Redis, not only with the locks.
// Entries it cannot decode (a fence that is not a number, a lock key of
// another type or without expiry) are skipped and reported in an error
// wrapping driver.ErrBadEntry, returned with the good entries.
func (s *Store) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	var (
		mu  sync.Mutex
		out []driver.LockInfo
		bad []string
	)
	scan := func(ctx context.Context, c Client) error {
		found, broken, err := s.scan(ctx, c, prefix)
		mu.Lock()
		out, bad = append(out, found...), append(bad, broken...)
		mu.Unlock()
		return err
	}
	var err error
	switch c := s.c.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	case interface {
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachShard(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	default:
		err = scan(ctx, s.c)
	}
	if err != nil {
		return nil, s.fail("list", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	if len(bad) > 0 {
		sort.Strings(bad)
		return out, fmt.Errorf("%w: redisstore: list %q: %d entries skipped: %s", driver.ErrBadEntry, prefix, len(bad), strings.Join(bad, "; "))
	}
	return out, nil
}

// scan lists the locks on one node: SCAN in batches, each batch read with one
// pipeline of inspect scripts. It returns the good entries and a description
// of each bad one.
func (s *Store) scan(ctx context.Context, c Client, prefix string) (out []driver.LockInfo, bad []string, err error) {
	match := globEscape(s.prefix) + "{" + globEscape(tag(prefix)) + "*}:lock"
	var cursor uint64
	for {
		names, next, err := c.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return out, bad, err
		}
		if len(names) > 0 {
			found, broken, err := s.inspectAll(ctx, c, names)
			if err != nil {
				return out, bad, err
			}
			out, bad = append(out, found...), append(bad, broken...)
		}
		if cursor = next; cursor == 0 {
			return out, bad, nil
		}
	}
}

func (s *Store) inspectAll(ctx context.Context, c Client, names []string) (out []driver.LockInfo, bad []string, err error) {
	keys := make([]string, 0, len(names))
	for _, n := range names {
		if k, ok := s.userKey(n); ok {
			keys = append(keys, k)
		}
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = s.runPiped(ctx, pipe, true, inspectScript, s.inspectKeys(k))
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	out = make([]driver.LockInfo, 0, len(keys))
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		switch {
		case errors.Is(err, redis.Nil):
			continue // released or expired since SCAN saw it
		case isEntryError(err):
			bad = append(bad, fmt.Sprintf("%q: %v", keys[i], err))
			continue
		case err != nil:
			return nil, nil, err
		}
		info, err := s.info(keys[i], res)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%q: %v", keys[i], err))
			continue
		}
		out = append(out, info)
	}
	return out, bad, nil
}

// userKey turns PREFIX{TAG}:lock back into the key.
func (s *Store) userKey(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, s.prefix+"{")
	if !ok {
		return "", false
	}
	t, ok := strings.CutSuffix(rest, "}:lock")
	if !ok || strings.ContainsAny(t, "{}") {
		return "", false
	}
	if strings.IndexByte(t, '%') >= 0 {
		t = tagUnescaper.Replace(t)
	}
	return t, true
}

// globEscape escapes the characters special to SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
