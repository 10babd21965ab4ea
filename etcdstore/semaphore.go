package etcdstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/waiters"
)

// maxPermitRetries bounds the transactions of one AcquirePermit that other
// acquirers keep beating; then it answers ErrNotAcquired (contention).
const maxPermitRetries = 32

// SemaphorePrefix returns the etcd prefix of key's semaphore: the store
// prefix without its trailing "/", "#sem/", len(key), ":", key and "/".
// Holders are under "h/" (valued as a lock without a token), waiters under
// "q/", and "g" is the guard (docs/etcd.md, "Semaphores").
func (s *Store) SemaphorePrefix(key string) string {
	return strings.TrimSuffix(s.prefix, "/") + "#sem/" + strconv.Itoa(len(key)) + ":" + key + "/"
}

// semState is one read of a semaphore; nil stands for an empty one.
type semState struct {
	holders, queue []*mvccpb.KeyValue // by create revision
	guardRev       int64              // mod revision of the guard, 0 if absent
	limit          int                // the guard's value
	rev            int64              // the revision of the read
}

// semReads read the semaphore under prefix p: the Else branch of every
// acquire's transaction, so that one that lost brings the state back.
func semReads(p string) []clientv3.Op {
	byCreate := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	return []clientv3.Op{clientv3.OpGet(p+"h/", byCreate...), clientv3.OpGet(p+"q/", byCreate...), clientv3.OpGet(p + "g")}
}

func semStateOf(resp *clientv3.TxnResponse) *semState {
	st := &semState{holders: resp.Responses[0].GetResponseRange().GetKvs(), queue: resp.Responses[1].GetResponseRange().GetKvs(), rev: resp.Header.Revision}
	if g := resp.Responses[2].GetResponseRange().GetKvs(); len(g) == 1 {
		st.guardRev = g[0].ModRevision
		st.limit, _ = strconv.Atoi(string(g[0].Value))
	}
	return st
}

// unchangedCmps hold when no holder or waiter joined the semaphore since st
// was read: its guard unchanged (every grant and new waiter rewrites it).
// An absent guard can come and go again, so then, and for the empty
// semaphore (nil), no holder or waiter key may be newer than the read.
func (st *semState) unchangedCmps(p string) []clientv3.Cmp {
	var cmps []clientv3.Cmp
	var rev int64
	if st != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(p+"g"), "=", st.guardRev))
		if st.guardRev != 0 {
			return cmps
		}
		rev = st.rev
	}
	return append(cmps,
		clientv3.Compare(clientv3.CreateRevision(p+"h/"), "<", rev+1).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(p+"q/"), "<", rev+1).WithPrefix())
}

// AcquirePermit implements driver.Semaphorer. Its first transaction grants
// on an empty semaphore, else reads it; each next one requires what it read
// unchanged, with jitter between them, up to maxPermitRetries.
func (s *Store) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	if req.Limit < 1 {
		return driver.Grant{}, fmt.Errorf("%w: etcdstore: permit limit must be at least 1, got %d", leasehold.ErrInvalidOptions, req.Limit)
	}
	if err := checkRequest(req.Key, req.Token, req.Holder, req.TTL); err != nil {
		return driver.Grant{}, err
	}
	var st *semState
	for attempt := range maxPermitRetries {
		// Lost a race on a fresh read: back off up to 16 ms.
		if attempt > 1 && !sleep(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(attempt-2, 4)))) {
			return driver.Grant{}, s.wrap(ctx, "acquire permit", req.Key, context.Cause(ctx))
		}
		g, next, err := s.tryPermit(ctx, req, st)
		if next == nil {
			return g, err
		}
		st = next
	}
	return driver.Grant{}, fmt.Errorf("%w: etcdstore: semaphore %q changed under each of %d attempts by other acquirers",
		leasehold.ErrNotAcquired, req.Key, maxPermitRetries)
}

// tryPermit makes one attempt on st: a grant, or a refusal that queues a
// waiter; next is the semaphore as the transaction found it when it lost.
// RequestTimeout bounds each attempt: the answers of the attempts before
// showed other acquirers, not an outage.
func (s *Store) tryPermit(ctx context.Context, req driver.PermitRequest, st *semState) (g driver.Grant, next *semState, err error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.Grant{}, nil, err
	}
	defer end()
	p := s.SemaphorePrefix(req.Key)
	ttl, refused := req.TTL, error(nil)
	var dead []*mvccpb.KeyValue
	if st != nil {
		if g, dead, refused = s.judge(st, req, p); refused != nil {
			if req.QueueTTL <= 0 {
				return g, nil, refused
			}
			ttl = req.QueueTTL
		}
	}
	id, err := s.sess.leases.get(ctx, ttl)
	if err != nil {
		return driver.Grant{}, nil, s.wrap(ctx, "acquire permit", req.Key, err)
	}
	cmps, ops := st.permitTxn(p, req, id, g.Fence, dead, refused != nil)
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(semReads(p)...).Commit()
	switch {
	case err != nil:
		return driver.Grant{}, nil, s.wrapLease(ctx, "acquire permit", req.Key, err, id)
	case !resp.Succeeded:
		return driver.Grant{}, semStateOf(resp), nil
	case refused != nil:
		return g, nil, refused
	case g.Fence == 0:
		g.Fence = uint64(resp.Header.Revision)
	}
	return g, nil, nil
}

// judge decides on st: our own permit again (its fence), a grant that takes
// over the holders in dead (seen unchanged for their TTL), or a refusal
// (ErrNotAcquired) and what to say of it.
func (s *Store) judge(st *semState, req driver.PermitRequest, p string) (g driver.Grant, dead []*mvccpb.KeyValue, err error) {
	if i := index(st.holders, p+"h/"+req.Token); i >= 0 {
		return driver.Grant{Fence: uint64(st.holders[i].CreateRevision)}, nil, nil
	}
	now := time.Now()
	ends := s.sights.ends(st.holders, now)
	first := 0 // the holder whose TTL ends first
	for i, kv := range st.holders {
		if !ends[i].After(now) {
			dead = append(dead, kv)
		}
		if ends[i].Before(ends[first]) {
			first = i
		}
	}
	g.Ahead = len(st.queue)
	if i := index(st.queue, p+"q/"+req.Token); i >= 0 {
		g.Ahead = i
	}
	if g.Ahead < req.Limit-len(st.holders)+len(dead) {
		return driver.Grant{}, dead, nil
	}
	if len(st.holders) >= req.Limit {
		_, _, g.Holder, _, _ = lockFields(st.holders[first].Value)
		g.Remaining = max(time.Until(ends[first]), time.Millisecond)
	}
	return g, nil, leasehold.ErrNotAcquired
}

// permitTxn returns the transaction that carries out judge's answer on st
// (nil: empty): a refused waiter's new queue entry (which rewrites the
// guard, so that no grant read before overtakes it) or refresh (on lease
// id, keeping its create revision: its place), our own permit again (fence),
// or a grant.
func (st *semState) permitTxn(p string, req driver.PermitRequest, id clientv3.LeaseID, fence uint64, dead []*mvccpb.KeyValue, refused bool) ([]clientv3.Cmp, []clientv3.Op) {
	hk, qk := p+"h/"+req.Token, p+"q/"+req.Token
	guard := clientv3.OpPut(p+"g", strconv.Itoa(req.Limit), clientv3.WithLease(id))
	if refused {
		if i := index(st.queue, qk); i >= 0 {
			return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qk), "=", st.queue[i].CreateRevision)},
				[]clientv3.Op{clientv3.OpPut(qk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(id))}
		}
		return append(st.unchangedCmps(p), clientv3.Compare(clientv3.CreateRevision(qk), "=", 0)),
			[]clientv3.Op{clientv3.OpPut(qk, req.Holder, clientv3.WithLease(id)), guard}
	}
	ops := []clientv3.Op{clientv3.OpPut(hk, lockValue("", req.TTL, req.Holder, 0), clientv3.WithLease(id)), guard}
	if st != nil {
		ops = append(ops, clientv3.OpDelete(qk))
	}
	if fence > 0 {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(hk), "=", int64(fence))}, ops
	}
	cmps := append(st.unchangedCmps(p), clientv3.Compare(clientv3.CreateRevision(hk), "=", 0))
	for _, kv := range dead {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		ops = append(ops, clientv3.OpDelete(string(kv.Key)))
	}
	return cmps, ops
}

func index(kvs []*mvccpb.KeyValue, k string) int {
	return slices.IndexFunc(kvs, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == k })
}

// permitSights are when this store first saw each holder key at its mod
// revision. Every renewal writes the key, so a holder seen unchanged for
// its TTL has stopped renewing and its own expiry guard no longer trusts
// it: a grant takes it over, guarded by that mod revision, before etcd's
// expiry (up to 1.5 s later).
type permitSights struct {
	mu    sync.Mutex
	m     map[string]sight
	prune int // len(m) at which the next pruning runs (at least maxSights)
}

type sight struct {
	mod int64
	at  time.Time
	ttl time.Duration
}

// maxSights is the size of permitSights at which it first drops the sights
// whose holder key is gone (deleted or rewritten): those older than their
// TTL and sightStale. A key is deleted by etcd at its lease's expiry, at
// most the TTL's whole seconds and leaseSlack after its last write (a
// leader change can add as much again), so no present holder loses its
// sight (which would delay its takeover by up to its TTL). Twice the sights
// left is the size of the next pruning.
const (
	maxSights  = 4096
	sightStale = time.Minute
)

// ends records sights of holders at now and returns when each one's TTL
// ends by them (far ahead for a holder without a TTL).
func (ps *permitSights) ends(holders []*mvccpb.KeyValue, now time.Time) []time.Time {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = make(map[string]sight)
	}
	if len(ps.m) >= max(ps.prune, maxSights) {
		for k, x := range ps.m {
			if now.Sub(x.at) > x.ttl+sightStale {
				delete(ps.m, k)
			}
		}
		ps.prune = 2 * len(ps.m)
	}
	out := make([]time.Time, len(holders))
	for i, kv := range holders {
		_, ttl, _, _, _ := lockFields(kv.Value)
		x := ps.m[string(kv.Key)]
		if x.mod != kv.ModRevision {
			x = sight{kv.ModRevision, now, ttl}
			ps.m[string(kv.Key)] = x
		}
		out[i] = now.Add(time.Hour)
		if ttl > 0 {
			out[i] = x.at.Add(ttl)
		}
	}
	return out
}

// RenewPermit implements driver.Semaphorer: one transaction moves the
// holder key to the current lease of ttl, keeping its fence, or answers
// ErrNotOwned; a second rewrites the value when the TTL changed.
func (s *Store) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkRequest(key, token, "", ttl); err != nil {
		return err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	id, err := s.sess.leases.get(ctx, ttl)
	if err != nil {
		return s.wrap(ctx, "renew permit", key, err)
	}
	hk := s.SemaphorePrefix(key) + "h/" + token
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(hk), ">", 0)).
		Then(clientv3.OpPut(hk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(id), clientv3.WithPrevKV())).Commit()
	switch {
	case err != nil:
		return s.wrapLease(ctx, "renew permit", key, err, id)
	case !resp.Succeeded:
		return leasehold.ErrNotOwned // released, expired or taken over
	}
	v := rewrite("", ttl, resp.Responses[0].GetResponsePut().GetPrevKv())
	return s.retried(ctx, "renew permit", key, hk, id, v, resp.Header.Revision)
}

// ReleasePermit implements driver.Semaphorer: one transaction deletes the
// holder key and the token's queue entry.
func (s *Store) ReleasePermit(ctx context.Context, key, token string) error {
	if err := checkNames(key, token, ""); err != nil {
		return err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	p := s.SemaphorePrefix(key)
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpDelete(p+"h/"+token), clientv3.OpDelete(p+"q/"+token)).Commit()
	if err != nil {
		return s.wrap(ctx, "release permit", key, err)
	}
	if resp.Responses[0].GetResponseDeleteRange().GetDeleted() == 0 {
		return leasehold.ErrNotHeld
	}
	return nil
}

// Permits implements driver.Semaphorer: one read, then one TimeToLive per
// holder for its remaining TTL (whole seconds, rounded down); holders by
// create revision, their fence.
func (s *Store) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.PermitInfo{}, err
	}
	defer end()
	p := s.SemaphorePrefix(key)
	resp, err := s.cli.Txn(ctx).Then(semReads(p)...).Commit()
	if err != nil {
		return driver.PermitInfo{}, s.wrap(ctx, "permits", key, err)
	}
	st := semStateOf(resp)
	info := driver.PermitInfo{Key: key, Limit: st.limit, Waiting: len(st.queue)}
	if len(st.queue) > 0 {
		info.NextHolder = string(st.queue[0].Value)
	}
	for _, kv := range st.holders {
		_, ttl, holder, _, _ := lockFields(kv.Value)
		info.Holders = append(info.Holders, driver.LockInfo{
			Key: key, Token: strings.TrimPrefix(string(kv.Key), p+"h/"), Holder: holder, Fence: uint64(kv.CreateRevision),
			Remaining: s.remaining(ctx, clientv3.LeaseID(kv.Lease), ttl, time.Millisecond),
			Facts:     map[string]string{"store": "etcd", "etcd_key": string(kv.Key), "lease": fmt.Sprintf("%x", kv.Lease)},
		})
	}
	return info, nil
}

// WaitPermit implements driver.PermitNotifier with a watch on the
// semaphore from the revision after one read (so it misses nothing). It wakes
// when token's turn comes (fewer waiters ahead than permits free under the
// guard's limit), again when someone leaves during it, on every delete
// while no guard was seen, when the watch breaks (then it reads and watches
// again), and at once for a waiter (token not empty). stop cancels the watch
// and waits for its goroutine.
func (s *Store) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if s.sess.closed() {
		return nil, nil, ErrClosed
	}
	wctx, cancel := context.WithCancel(ctx)
	m, wch, err := s.watchPermits(wctx, key, token)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	ch := make(chan driver.Wake, 1)
	wake := func() { waiters.Send(ch, driver.Wake{}) }
	if m.was || token != "" {
		wake()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for wr := range wch {
				if wr.Err() != nil || m.apply(wr.Events, &s.sights) {
					wake()
				}
			}
			if wctx.Err() != nil {
				return
			}
			wake() // the watch broke for good (a compacted revision): start again
			for {
				if s.sess.closed() || !sleep(wctx, 100*time.Millisecond) {
					return
				}
				if m, wch, err = s.watchPermits(wctx, key, token); err == nil {
					break
				}
			}
			if m.was {
				wake()
			}
		}
	}()
	return ch, sync.OnceFunc(func() { cancel(); <-done }), nil
}

// watchPermits reads key's semaphore and watches it from the next revision,
// until ctx ends; the model is token's view as of the read.
func (s *Store) watchPermits(ctx context.Context, key, token string) (*permitModel, clientv3.WatchChan, error) {
	p := s.SemaphorePrefix(key)
	rctx, rcancel := context.WithTimeout(ctx, s.startTimeout())
	resp, err := s.cli.Txn(rctx).Then(semReads(p)...).Commit()
	rcancel()
	if err != nil {
		return nil, nil, fmt.Errorf("etcdstore: watch permits %q: %w", key, err)
	}
	st := semStateOf(resp)
	m := &permitModel{p: p, me: p + "q/" + token, keys: map[string]int64{}, limit: st.limit}
	for _, kv := range append(st.holders, st.queue...) {
		m.keys[string(kv.Key)] = kv.CreateRevision
	}
	m.was = m.turn()
	return m, s.cli.Watch(ctx, p, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)), nil
}

// permitModel is one WaitPermit's view of a semaphore, kept from its watch
// events by the watch goroutine after WaitPermit returns.
type permitModel struct {
	p, me string           // the semaphore's prefix, the token's queue entry key
	keys  map[string]int64 // holder and waiter keys -> create revision
	limit int              // 0 until a guard was seen
	was   bool             // the turn had come at the last check
}

// turn reports whether fewer waiters are ahead of the token than permits
// are free.
func (m *permitModel) turn() bool {
	mine, queued := m.keys[m.me]
	holders, ahead := 0, 0
	for k, rev := range m.keys {
		switch {
		case strings.HasPrefix(k, m.p+"h/"):
			holders++
		case !queued || rev < mine:
			ahead++
		}
	}
	return m.limit > 0 && ahead < m.limit-holders
}

// apply applies watch events (a holder's write is a sight) and reports
// whether to wake: the turn came, or someone left during it (a waiter
// that lost its grant to a newcomer is not left asleep); with no limit
// known, whether anything was deleted.
func (m *permitModel) apply(evs []*clientv3.Event, sights *permitSights) bool {
	freed := false
	for _, ev := range evs {
		switch k := string(ev.Kv.Key); {
		case k == m.p+"g":
			if ev.Type == mvccpb.PUT {
				m.limit, _ = strconv.Atoi(string(ev.Kv.Value))
			}
		case ev.Type == mvccpb.DELETE:
			delete(m.keys, k)
			freed = true
		default:
			m.keys[k] = ev.Kv.CreateRevision
			if strings.HasPrefix(k, m.p+"h/") {
				sights.ends([]*mvccpb.KeyValue{ev.Kv}, time.Now())
			}
		}
	}
	if m.limit <= 0 {
		return freed
	}
	now := m.turn()
	m.was, now = now, now && (!m.was || freed)
	return now
}
