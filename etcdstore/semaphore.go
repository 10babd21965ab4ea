package etcdstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

var (
	_ driver.Semaphorer     = (*Store)(nil)
	_ driver.PermitNotifier = (*Store)(nil)
)

// maxPermitRetries bounds the optimistic retries of one AcquirePermit when
// other acquirers keep changing the semaphore between its read and its
// transaction; then it answers ErrNotAcquired (contention).
const maxPermitRetries = 32

// SemaphorePrefix returns the etcd prefix of key's semaphore: the store
// prefix without its trailing "/", "#sem/", len(key), ":", key and "/".
// Holders are under "h/", waiters under "q/", and "g" is the guard
// (docs/etcd.md, "Semaphores").
func (s *Store) SemaphorePrefix(key string) string {
	return strings.TrimSuffix(s.prefix, "/") + "#sem/" + strconv.Itoa(len(key)) + ":" + key + "/"
}

// semState is one read of a semaphore. A nil *semState stands for an empty
// semaphore, assumed by an acquire's first transaction.
type semState struct {
	holders, queue []*mvccpb.KeyValue // by create revision
	guardRev       int64              // mod revision of the guard, 0 if absent
	limit          int                // the guard's value
	rev            int64              // the revision of the read
}

// semReads read a semaphore's holders, waiters and guard under prefix p;
// the Else branch of every acquire's transaction, so that one that lost
// brings the state back.
func semReads(p string) []clientv3.Op {
	byCreate := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	return []clientv3.Op{clientv3.OpGet(p+"h/", byCreate...), clientv3.OpGet(p+"q/", byCreate...), clientv3.OpGet(p + "g")}
}

// semStateOf decodes the responses of semReads.
func semStateOf(resp *clientv3.TxnResponse) *semState {
	st := &semState{
		holders: resp.Responses[0].GetResponseRange().GetKvs(),
		queue:   resp.Responses[1].GetResponseRange().GetKvs(),
		rev:     resp.Header.Revision,
	}
	if g := resp.Responses[2].GetResponseRange().GetKvs(); len(g) == 1 {
		st.guardRev = g[0].ModRevision
		st.limit, _ = strconv.Atoi(string(g[0].Value))
	}
	return st
}

// readSem reads holders, waiters and guard in one transaction.
func (s *Store) readSem(ctx context.Context, key string) (*semState, error) {
	resp, err := s.cli.Txn(ctx).Then(semReads(s.SemaphorePrefix(key))...).Commit()
	if err != nil {
		return nil, err
	}
	return semStateOf(resp), nil
}

// unchangedCmps hold when no holder or waiter joined the semaphore under p
// since st was read: its guard unchanged (every grant and new waiter
// rewrites it). An absent guard can come and go again, so then, and for the
// empty semaphore (nil), no holder or waiter key may be newer than the read.
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
// when the semaphore is empty; otherwise its Else branch reads it, and the
// next grants in a transaction that requires the guard unchanged since,
// retried with jitter up to maxPermitRetries times, then ErrNotAcquired.
// The fence is the holder key's create revision.
func (s *Store) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	if req.Limit < 1 {
		return driver.Grant{}, fmt.Errorf("%w: etcdstore: permit limit must be at least 1, got %d", leasehold.ErrInvalidOptions, req.Limit)
	}
	if err := checkRequest(req.Key, req.Token, req.Holder, req.TTL); err != nil {
		return driver.Grant{}, err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	defer end()
	id, err := s.sess.leases.get(ctx, req.TTL)
	if err != nil {
		return driver.Grant{}, s.wrap(ctx, "acquire permit", req.Key, err)
	}
	var st *semState
	for attempt := range maxPermitRetries {
		if attempt > 1 { // lost a race on a fresh read: back off up to 16 ms, at random
			t := time.NewTimer(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt-2, 4))))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return driver.Grant{}, s.wrap(ctx, "acquire permit", req.Key, context.Cause(ctx))
			}
		}
		g, next, err := s.tryPermit(ctx, req, id, st)
		if next == nil {
			return g, err
		}
		st = next
	}
	return driver.Grant{}, fmt.Errorf("%w: etcdstore: semaphore %q changed under each of %d attempts by other acquirers",
		leasehold.ErrNotAcquired, req.Key, maxPermitRetries)
}

// tryPermit makes one attempt on state st; next is the semaphore as its
// transaction found it when it lost.
func (s *Store) tryPermit(ctx context.Context, req driver.PermitRequest, id clientv3.LeaseID, st *semState) (g driver.Grant, next *semState, err error) {
	p := s.SemaphorePrefix(req.Key)
	hk, qk := p+"h/"+req.Token, p+"q/"+req.Token
	put := clientv3.OpPut(hk, permitValue(req.TTL, req.Holder), clientv3.WithLease(id))
	cmps := st.unchangedCmps(p)
	ops := []clientv3.Op{put, clientv3.OpPut(p+"g", strconv.Itoa(req.Limit), clientv3.WithLease(id)), clientv3.OpDelete(qk)}
	var dead []*mvccpb.KeyValue
	if st != nil {
		if i := st.index(st.holders, hk); i >= 0 { // our own retry: keep the fence
			mine := st.holders[i]
			cmps, ops = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(hk), "=", mine.ModRevision)}, []clientv3.Op{put, clientv3.OpDelete(qk)}
			g.Fence = uint64(mine.CreateRevision)
		} else {
			ends, now := s.sights.ends(st.holders), time.Now()
			pos := st.index(st.queue, qk)
			ahead := len(st.queue)
			if pos >= 0 {
				ahead = pos
			}
			for i, kv := range st.holders { // seen unchanged for their TTL: taken over
				if !ends[i].After(now) {
					dead = append(dead, kv)
					cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
					ops = append(ops, clientv3.OpDelete(string(kv.Key)))
				}
			}
			if ahead >= req.Limit-len(st.holders)+len(dead) {
				return s.refuse(ctx, req, st, pos, ahead, ends)
			}
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(hk), "=", 0))
		}
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(semReads(p)...).Commit()
	switch {
	case err != nil:
		return driver.Grant{}, nil, s.wrap(ctx, "acquire permit", req.Key, err)
	case !resp.Succeeded:
		return driver.Grant{}, semStateOf(resp), nil
	}
	for _, kv := range dead {
		s.sights.forget(string(kv.Key))
	}
	if g.Fence == 0 {
		g.Fence = uint64(resp.Header.Revision)
	}
	return g, nil, nil
}

// index returns the index of key k in kvs, or -1.
func (st *semState) index(kvs []*mvccpb.KeyValue, k string) int {
	for i, kv := range kvs {
		if string(kv.Key) == k {
			return i
		}
	}
	return -1
}

// refuse queues a waiting token (QueueTTL > 0) at index pos of st's queue
// (-1: not queued) and describes the contention; ends are the holders'
// ends by this store's sights.
func (s *Store) refuse(ctx context.Context, req driver.PermitRequest, st *semState, pos, ahead int, ends []time.Time) (driver.Grant, *semState, error) {
	if req.QueueTTL > 0 {
		qid, err := s.sess.leases.get(ctx, req.QueueTTL)
		if err != nil {
			return driver.Grant{}, nil, s.wrap(ctx, "acquire permit", req.Key, err)
		}
		p := s.SemaphorePrefix(req.Key)
		qk := p + "q/" + req.Token
		// A new entry rewrites the guard, so that no grant read before
		// overtakes it; a refresh moves the entry to the current lease,
		// keeping its create revision: its place.
		cmps := append(st.unchangedCmps(p), clientv3.Compare(clientv3.CreateRevision(qk), "=", 0))
		ops := []clientv3.Op{clientv3.OpPut(qk, req.Holder, clientv3.WithLease(qid)), clientv3.OpPut(p+"g", strconv.Itoa(req.Limit), clientv3.WithLease(qid))}
		if pos >= 0 {
			cmps = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qk), "=", st.queue[pos].CreateRevision)}
			ops = []clientv3.Op{clientv3.OpPut(qk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(qid))}
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(semReads(p)...).Commit()
		switch {
		case err != nil:
			return driver.Grant{}, nil, s.wrapLease(ctx, "acquire permit", req.Key, err, qid)
		case !resp.Succeeded:
			return driver.Grant{}, semStateOf(resp), nil
		}
	}
	g := driver.Grant{Ahead: ahead}
	if len(st.holders) >= req.Limit {
		first := 0 // the holder whose TTL ends first
		for i := range ends {
			if ends[i].Before(ends[first]) {
				first = i
			}
		}
		_, g.Holder = permitFields(st.holders[first].Value)
		g.Remaining = max(time.Until(ends[first]), time.Millisecond)
	}
	return g, nil, leasehold.ErrNotAcquired
}

// permitValue is a holder key's value: NUL ttl-in-ms NUL holder.
func permitValue(ttl time.Duration, holder string) string {
	return "\x00" + strconv.FormatInt(ttl.Milliseconds(), 10) + "\x00" + holder
}

// permitFields decodes a holder key's value; ttl is 0 when unknown.
func permitFields(v []byte) (ttl time.Duration, holder string) {
	_, rest, _ := strings.Cut(string(v), "\x00")
	ms, holder, _ := strings.Cut(rest, "\x00")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return time.Duration(max(n, 0)) * time.Millisecond, holder
}

// permitSights are when this store first saw each holder key at its
// current mod revision. Every renewal writes the key, so a holder seen
// unchanged for its TTL has stopped renewing, and its own expiry guard
// (from before it sent its last renewal) has stopped trusting it: an
// acquire takes its permit over in the grant's transaction, guarded by that
// mod revision, before etcd's expiry (up to 1.5 s later).
type permitSights struct {
	mu sync.Mutex
	m  map[string]sight
}

type sight struct {
	mod int64
	at  time.Time
}

// maxSights bounds the memory of permitSights: past it, it starts afresh.
const maxSights = 4096

// ends records the sights of holders and returns when each one's TTL ends
// by them (far ahead for a holder without a TTL).
func (ps *permitSights) ends(holders []*mvccpb.KeyValue) []time.Time {
	now := time.Now()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil || len(ps.m) >= maxSights {
		ps.m = make(map[string]sight)
	}
	out := make([]time.Time, len(holders))
	for i, kv := range holders {
		k := string(kv.Key)
		x, ok := ps.m[k]
		if !ok || x.mod < kv.ModRevision {
			x = sight{kv.ModRevision, now}
			ps.m[k] = x
		}
		ttl, _ := permitFields(kv.Value)
		out[i] = now.Add(time.Hour)
		if x.mod == kv.ModRevision && ttl > 0 {
			out[i] = x.at.Add(ttl)
		}
	}
	return out
}

func (ps *permitSights) forget(k string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.m, k)
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
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(hk), ">", 0)).
		Then(clientv3.OpPut(hk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(id), clientv3.WithPrevKV())).
		Commit()
	if err != nil {
		return s.wrapLease(ctx, "renew permit", key, err, id)
	}
	if !resp.Succeeded {
		return leasehold.ErrNotOwned
	}
	was, holder := permitFields(resp.Responses[0].GetResponsePut().GetPrevKv().GetValue())
	if was == ttl {
		return nil
	}
	resp, err = s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(hk), "=", resp.Header.Revision)).
		Then(clientv3.OpPut(hk, permitValue(ttl, holder), clientv3.WithLease(id))).
		Commit()
	switch {
	case err != nil:
		return s.wrapLease(ctx, "renew permit", key, err, id)
	case !resp.Succeeded:
		return leasehold.ErrNotOwned // released or taken over meanwhile
	}
	return nil
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
	hk := s.SemaphorePrefix(key) + "h/" + token
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpDelete(hk), clientv3.OpDelete(s.SemaphorePrefix(key)+"q/"+token)).Commit()
	if err != nil {
		return s.wrap(ctx, "release permit", key, err)
	}
	s.sights.forget(hk)
	if resp.Responses[0].GetResponseDeleteRange().GetDeleted() == 0 {
		return leasehold.ErrNotHeld
	}
	return nil
}

// Permits implements driver.Semaphorer: one read, then one TimeToLive per
// holder for its remaining TTL (whole seconds, rounded down).
func (s *Store) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.PermitInfo{}, err
	}
	defer end()
	st, err := s.readSem(ctx, key)
	if err != nil {
		return driver.PermitInfo{}, s.wrap(ctx, "permits", key, err)
	}
	p := s.SemaphorePrefix(key)
	info := driver.PermitInfo{Key: key, Limit: st.limit, Waiting: len(st.queue)}
	if len(st.queue) > 0 {
		info.NextHolder = string(st.queue[0].Value)
	}
	for _, kv := range st.holders {
		ttl, holder := permitFields(kv.Value)
		info.Holders = append(info.Holders, driver.LockInfo{
			Key: key, Token: strings.TrimPrefix(string(kv.Key), p+"h/"), Holder: holder,
			Fence:     uint64(kv.CreateRevision),
			Remaining: s.remaining(ctx, clientv3.LeaseID(kv.Lease), ttl, time.Millisecond),
			Facts:     map[string]string{"store": "etcd", "etcd_key": string(kv.Key), "lease": fmt.Sprintf("%x", kv.Lease)},
		})
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Fence < info.Holders[j].Fence })
	return info, nil
}

// WaitPermit implements driver.PermitNotifier with a watch on the
// semaphore, started after one read. The channel gets a value each time
// token's turn comes (fewer waiters ahead of it, all while it has not
// joined, than permits free under the guard's limit), again when someone
// leaves while it is its turn, on every delete while no guard was seen, and
// when the watch breaks, and once at once for a waiter (token not empty).
// It returns once etcd confirmed the watch; stop cancels it and waits for
// its goroutine.
func (s *Store) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if s.sess.closed() {
		return nil, nil, ErrClosed
	}
	startTimeout := s.startTimeout()
	rctx, rcancel := context.WithTimeout(ctx, startTimeout)
	st, err := s.readSem(rctx, key)
	rcancel()
	if err != nil {
		return nil, nil, fmt.Errorf("etcdstore: watch permits %q: %w", key, err)
	}
	m := newPermitModel(s.SemaphorePrefix(key), token, st)
	wctx, cancel := context.WithCancel(ctx)
	wch := s.cli.Watch(wctx, s.SemaphorePrefix(key), clientv3.WithPrefix(), clientv3.WithRev(st.rev+1), clientv3.WithCreatedNotify())
	if err := awaitCreated(wctx, wch, startTimeout); err != nil {
		cancel()
		drain(wch)
		return nil, nil, fmt.Errorf("etcdstore: watch permits %q: %w", key, err)
	}
	ch := make(chan driver.Wake, 1)
	wake := func() {
		select {
		case ch <- driver.Wake{}:
		default:
		}
	}
	if m.was || token != "" {
		wake() // the turn has already come, or a waiter re-checks once
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wr := range wch {
			if wr.Err() != nil || m.apply(wr.Events, &s.sights) {
				wake()
			}
		}
		if wctx.Err() == nil {
			wake()
		}
	}()
	var once sync.Once
	return ch, func() { once.Do(func() { cancel(); <-done }) }, nil
}

// awaitCreated waits for etcd's confirmation of a watch.
func awaitCreated(wctx context.Context, wch clientv3.WatchChan, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case wr, ok := <-wch:
		if ok && wr.Created && wr.Err() == nil {
			return nil
		}
		if err := wr.Err(); err != nil {
			return err
		}
		return context.Cause(wctx)
	case <-t.C:
		return fmt.Errorf("%w: etcd did not confirm the watch within %v", ErrUnavailable, timeout)
	}
}

// permitModel is one WaitPermit's view of a semaphore, kept from its watch
// events by the watch goroutine after WaitPermit returns.
type permitModel struct {
	p, me string           // the semaphore's prefix, the token's queue entry key
	keys  map[string]int64 // holder and waiter keys -> create revision
	limit int              // 0 until a guard was seen
	was   bool             // the turn had come at the last check
}

func newPermitModel(p, token string, st *semState) *permitModel {
	m := &permitModel{p: p, me: p + "q/" + token, keys: map[string]int64{}, limit: st.limit}
	for _, kv := range append(st.holders, st.queue...) {
		m.keys[string(kv.Key)] = kv.CreateRevision
	}
	m.was = m.turn()
	return m
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
// whether the token's turn came with them (or, with no limit known, whether
// anything was deleted).
func (m *permitModel) apply(evs []*clientv3.Event, sights *permitSights) bool {
	freed := false // a holder or a waiter left
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		switch {
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
				sights.ends([]*mvccpb.KeyValue{ev.Kv})
			}
		}
	}
	if m.limit <= 0 {
		return freed
	}
	// Wake when the turn comes, and again when someone leaves during it: a
	// waiter that lost its grant to a newcomer is not left asleep.
	now := m.turn()
	m.was, now = now, now && (!m.was || freed)
	return now
}
