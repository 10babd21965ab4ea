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
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.LockInfo{}, err
	}
	defer end()
	ks, ke := s.keyRange(key)
	get, err := s.cli.Get(ctx, ks, clientv3.WithRange(ke))
	if err != nil {
		return driver.LockInfo{}, s.wrap(ctx, "inspect", key, err)
	}
	infos, bad, err := s.describe(ctx, get.Kvs)
	if err != nil {
		return driver.LockInfo{}, s.wrap(ctx, "inspect", key, err)
	}
	if len(bad) > 0 {
		return driver.LockInfo{}, fmt.Errorf("etcdstore: inspect %q: %w: %s", key, leasehold.ErrBadEntry, bad[0])
	}
	if len(infos) == 0 || infos[0].Key != key {
		return driver.LockInfo{}, leasehold.ErrNotHeld
	}
	return infos[0], nil
}

// List implements driver.Inspector: one range read of the locks and
// queues under the prefix (etcd returns keys sorted), then one
// LeaseTimeToLive per lease (the store's locks share a few).
func (s *Store) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	p := s.prefix + prefix
	get, err := s.cli.Get(ctx, p, clientv3.WithRange(clientv3.GetPrefixRangeEnd(p)))
	if err != nil {
		return nil, s.wrap(ctx, "list", prefix, err)
	}
	infos, bad, err := s.describe(ctx, get.Kvs)
	if err != nil {
		return nil, s.wrap(ctx, "list", prefix, err)
	}
	if len(bad) > 0 {
		return infos, fmt.Errorf("etcdstore: list %q: %w: skipped %d: %s", prefix, leasehold.ErrBadEntry, len(bad), strings.Join(bad, "; "))
	}
	return infos, nil
}

// describe turns sorted kvs of locks and queue entries into LockInfos,
// leaving out locks whose lease expired and reporting undecodable ones in bad.
func (s *Store) describe(ctx context.Context, kvs []*mvccpb.KeyValue) (out []driver.LockInfo, bad []string, err error) {
	ttls := map[int64]int64{} // lease -> TTL
	var cur *driver.LockInfo
	var headAt int64
	for _, kv := range kvs {
		name := string(kv.Key[len(s.prefix):])
		if lock, _, isEntry := strings.Cut(name, "\x00"); isEntry {
			if cur != nil && cur.Key == lock {
				cur.Waiting++
				if headAt == 0 || kv.CreateRevision < headAt {
					headAt = kv.CreateRevision
					cur.NextHolder, _ = entryFields(kv.Value)
				}
			}
			continue
		}
		info, ok, err := s.lockInfo(ctx, name, kv, ttls)
		switch {
		case err != nil:
			return nil, nil, err
		case !ok && info.Key != "":
			bad = append(bad, fmt.Sprintf("%q: lock value without a token", name))
			cur = nil
		case !ok:
			cur = nil
		default:
			out = append(out, info)
			cur, headAt = &out[len(out)-1], 0
		}
	}
	return out, bad, nil
}

// lockInfo describes one lock key. ok is false for a lock to skip: expired
// (info.Key empty) or undecodable (info.Key set).
func (s *Store) lockInfo(ctx context.Context, name string, kv *mvccpb.KeyValue, ttls map[int64]int64) (driver.LockInfo, bool, error) {
	tok, ttl, holder, _, ok := lockFields(kv.Value)
	info := driver.LockInfo{Key: name, Token: tok, Holder: holder, Fence: fenceOf(kv)}
	if !ok {
		return info, false, nil
	}
	info.Facts = s.facts(kv)
	if kv.Lease == 0 {
		return info, true, nil
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

func (s *Store) facts(kv *mvccpb.KeyValue) map[string]string {
	return map[string]string{
		"store":           "etcd",
		"etcd_key":        string(kv.Key),
		"lease":           strconv.FormatInt(kv.Lease, 16),
		"create_revision": strconv.FormatInt(kv.CreateRevision, 10),
		"mod_revision":    strconv.FormatInt(kv.ModRevision, 10),
		"version":         strconv.FormatInt(kv.Version, 10),
	}
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
	tok, ttl, holder, _, _ := lockFields(kv.Value)
	info := driver.LockInfo{Key: key, Token: tok, Holder: holder, Fence: fenceOf(kv), Facts: s.facts(kv)}
	if kv.Lease != 0 {
		info.Remaining = s.remaining(ctx, clientv3.LeaseID(kv.Lease), ttl, 0)
	}
	info.Facts["forced"] = "deleted the lock key"
	return info, nil
}
