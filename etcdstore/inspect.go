package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Inspect implements driver.Inspector: one linearizable read of the lock
// and its queue, then LeaseTimeToLive for the remaining TTL (whole seconds,
// rounded down, capped by the lock's TTL).
func (s *Store) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	ks, ke := s.keyRange(key)
	infos, bad, err := s.read(ctx, "inspect", key, ks, ke)
	switch {
	case err != nil:
		return driver.LockInfo{}, err
	case len(bad) > 0:
		return driver.LockInfo{}, fmt.Errorf("etcdstore: inspect %q: %w: %s", key, leasehold.ErrBadEntry, bad[0])
	case len(infos) == 0 || infos[0].Key != key:
		return driver.LockInfo{}, leasehold.ErrNotHeld
	}
	return infos[0], nil
}

// List implements driver.Inspector: one range read of the locks and
// queues under the prefix (etcd returns keys sorted), then one
// LeaseTimeToLive per lease (the store's locks share a few).
func (s *Store) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	p := s.prefix + prefix
	infos, bad, err := s.read(ctx, "list", prefix, p, clientv3.GetPrefixRangeEnd(p))
	if err == nil && len(bad) > 0 {
		err = fmt.Errorf("etcdstore: list %q: %w: skipped %d: %s", prefix, leasehold.ErrBadEntry, len(bad), strings.Join(bad, "; "))
	}
	return infos, err
}

// read describes the locks and queue entries in [start, end), leaving out
// locks whose lease expired and reporting undecodable ones in bad.
func (s *Store) read(ctx context.Context, op, name, start, end string) (out []driver.LockInfo, bad []string, err error) {
	ctx, done, err := s.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	get, err := s.cli.Get(ctx, start, clientv3.WithRange(end))
	if err != nil {
		return nil, nil, s.wrap(ctx, op, name, err)
	}
	ttls := map[int64]int64{} // lease -> TTL
	var cur *driver.LockInfo
	var headAt int64
	for _, kv := range get.Kvs {
		k := string(kv.Key[len(s.prefix):])
		if lock, _, isEntry := strings.Cut(k, "\x00"); isEntry {
			if cur != nil && cur.Key == lock {
				cur.Waiting++
				if headAt == 0 || kv.CreateRevision < headAt {
					headAt = kv.CreateRevision
					cur.NextHolder, _ = entryFields(kv.Value)
				}
			}
			continue
		}
		info, ok, err := s.lockInfo(ctx, k, kv, ttls)
		cur = nil
		switch {
		case err != nil:
			return nil, nil, s.wrap(ctx, op, name, err)
		case ok:
			out = append(out, info)
			cur, headAt = &out[len(out)-1], 0
		case info.Key != "":
			bad = append(bad, fmt.Sprintf("%q: lock value without a token", k))
		}
	}
	return out, bad, nil
}

// lockInfo describes one lock key. ok is false for a lock to skip: expired
// (info.Key empty) or undecodable (info.Key set).
func (s *Store) lockInfo(ctx context.Context, name string, kv *mvccpb.KeyValue, ttls map[int64]int64) (driver.LockInfo, bool, error) {
	info, ttl, ok := s.info(name, kv)
	if !ok || kv.Lease == 0 {
		return info, ok, nil
	}
	left, seen := ttls[kv.Lease]
	if !seen {
		r, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			left = -1
		case err != nil:
			return info, false, err
		default:
			left = r.TTL
		}
		ttls[kv.Lease] = left
	}
	if left < 0 {
		return driver.LockInfo{}, false, nil
	}
	info.Remaining = time.Duration(left) * time.Second
	if ttl > 0 {
		info.Remaining = min(info.Remaining, ttl)
		info.Facts["ttl"] = ttl.String()
	}
	return info, true, nil
}

// info decodes lock key kv of key; ok is false for a value without a token.
func (s *Store) info(key string, kv *mvccpb.KeyValue) (info driver.LockInfo, ttl time.Duration, ok bool) {
	tok, ttl, holder, _, ok := lockFields(kv.Value)
	facts := map[string]string{
		"store":           "etcd",
		"etcd_key":        string(kv.Key),
		"lease":           strconv.FormatInt(kv.Lease, 16),
		"create_revision": strconv.FormatInt(kv.CreateRevision, 10),
		"mod_revision":    strconv.FormatInt(kv.ModRevision, 10),
		"version":         strconv.FormatInt(kv.Version, 10),
	}
	return driver.LockInfo{Key: key, Token: tok, Holder: holder, Fence: fenceOf(kv), Facts: facts}, ttl, ok
}

// ForceRelease implements driver.ForceReleaser: it deletes the lock
// whoever holds it; the holder's next Renew answers ErrNotOwned.
func (s *Store) ForceRelease(ctx context.Context, key string) (driver.LockInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.LockInfo{}, err
	}
	defer end()
	resp, err := s.cli.Delete(ctx, s.lockKey(key), clientv3.WithPrevKV())
	if err != nil {
		return driver.LockInfo{}, s.wrap(ctx, "force release", key, err)
	}
	if len(resp.PrevKvs) == 0 {
		return driver.LockInfo{}, leasehold.ErrNotHeld
	}
	kv := resp.PrevKvs[0]
	info, ttl, _ := s.info(key, kv)
	if kv.Lease != 0 {
		info.Remaining = s.remaining(ctx, clientv3.LeaseID(kv.Lease), ttl, 0)
	}
	info.Facts["forced"] = "deleted the lock key"
	return info, nil
}
