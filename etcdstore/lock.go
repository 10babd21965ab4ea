package etcdstore

import (
	"context"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Acquire implements driver.Store in one transaction (docs/etcd.md): a
// retry keeps its lock and fence; a free key whose queue is empty or headed
// by the token is taken; otherwise a waiting acquire (QueueTTL > 0) writes
// its queue entry, keeping its place. A losing TryAcquire makes one more
// request (LeaseTimeToLive) for Grant.Remaining.
func (s *Store) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := checkRequest(req.Key, req.Token, req.Holder, req.TTL); err != nil {
		return driver.Grant{}, err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	defer end()
	for try := 0; ; try++ {
		l, err := s.sess.leases.get(ctx, req.TTL)
		var ql clientv3.LeaseID
		switch {
		case err != nil || req.QueueTTL <= 0:
		case req.Kept > 0: // the place lives with the Store's presence
			ql, _, err = s.sess.leases.presence(ctx, req.QueueTTL)
		default:
			ql, err = s.sess.leases.get(ctx, req.QueueTTL)
		}
		if err != nil {
			return driver.Grant{}, s.wrap(ctx, "acquire", req.Key, err)
		}
		if ql != 0 {
			if g, done, err := s.tryTakeOver(ctx, req, l); done {
				return g, err
			}
		}
		g, err := s.acquire(ctx, req, l, ql)
		if try == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			continue // queued past its lease, now known gone: refused, so again on the current ones
		}
		return g, err
	}
}

// acquire runs the acquire transaction once, or again when the answer shows
// the token heading the queue of a free key or holding the lock unknown to
// this store (a retry through another Store).
func (s *Store) acquire(ctx context.Context, req driver.AcquireRequest, l, ql clientv3.LeaseID) (driver.Grant, error) {
	r := ref{req.Key, req.Token}
	forced := false // the lock held the token though the store did not know (or not at the grant it saw)
	for attempt := 0; ; attempt++ {
		st := s.sess.standingOf(r) // each attempt: a token queued by the last may have been granted
		if forced {
			st.mayOwn, st.grantMod = true, 0
		}
		sent := time.Now()
		resp, err := s.acquireTxn(ctx, req, l, ql, st)
		seen := time.Now()
		if err != nil { // it may have applied: the next acquire checks for the lock and entry
			s.sess.track(s.sess.held, r, req.TTL)
			s.sess.moved(r, 0) // a grant it took: at a mod revision unknown
			if ql != 0 {
				s.sess.track(s.sess.waiting, r, queueTTL(req))
			}
			return driver.Grant{}, s.wrapLease(ctx, "acquire", req.Key, err, l, ql)
		}
		if g, done, err := s.acquired(ctx, req, l, st, resp); done {
			return g, err
		}
		rs := resp.Responses
		if st.mayOwn {
			rs = rs[0].GetResponseTxn().GetResponses()
		}
		v := s.view(req.Key, req.Token, rs[len(rs)-1].GetResponseRange().GetKvs(), resp.Header.Revision)
		if (!st.mayOwn || st.grantMod > 0) && ownedBy(v.lock, req.Token) {
			forced = true      // ask again with the retry check
			s.sess.moved(r, 0) // a grant seen is not this lock: taken by token from now on
			if ql != 0 {       // and delete, at Release, the entry this answer put
				s.sess.track(s.sess.waiting, r, queueTTL(req))
			}
			continue
		}
		left := time.Duration(-1) // unknown
		if ql != 0 {
			t := s.sess.track(s.sess.waiting, r, queueTTL(req))
			left = s.sess.setQueue(t, v, sent, seen, req.TTL)
			if v.lock == nil && v.myRev > 0 && v.ahead == 0 && attempt == 0 {
				continue // we head the queue of a free key: take it now
			}
		}
		if v.lock == nil && v.ahead > 0 && attempt == 0 && s.handToHead(ctx, req.Key, v) {
			continue // the head has it now: we wait behind it
		}
		return s.contended(ctx, req, v, left), leasehold.ErrNotAcquired
	}
}

// acquired finishes an acquire whose transaction took the lock, or found
// it holding the token (st.mayOwn: a retry); done is false otherwise.
func (s *Store) acquired(ctx context.Context, req driver.AcquireRequest, l clientv3.LeaseID, st standing, resp *clientv3.TxnResponse) (g driver.Grant, done bool, err error) {
	r := ref{req.Key, req.Token}
	if resp.Succeeded { // taken
		s.sess.took(r, req.TTL, resp.Header.Revision, s.headOf(req.Key, resp.Responses))
		// All puts of a transaction carry its revision, the header's.
		return driver.Grant{Fence: uint64(resp.Header.Revision)}, true, nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if !st.mayOwn || !inner.GetSucceeded() {
		return g, false, nil
	}
	if st.grantMod > 0 { // a grant this store saw, rewritten whole; it deleted our entry
		s.sess.took(r, req.TTL, resp.Header.Revision, s.headOf(req.Key, inner.GetResponses()))
		return driver.Grant{Fence: uint64(st.fence)}, true, nil
	}
	s.sess.track(s.sess.held, r, req.TTL) // our own lock: a retry
	prev := inner.GetResponses()[0].GetResponsePut().GetPrevKv()
	v := rewrite(req.Token, req.TTL, prev)
	if err := s.retried(ctx, "acquire", req.Key, s.lockKey(req.Key), l, v, resp.Header.Revision); err != nil {
		if errors.Is(err, leasehold.ErrNotOwned) {
			err = s.wrap(ctx, "acquire", req.Key, errors.New("the lock changed while its TTL was being updated"))
		}
		return g, true, err
	}
	return driver.Grant{Fence: fenceOf(prev)}, true, nil
}

// queueTTL is how long the store tracks the queue entry of req: a place the
// presence keeps is refreshed only every Kept/3.
func queueTTL(req driver.AcquireRequest) time.Duration {
	return max(req.QueueTTL, req.Kept)
}

// handToHead hands key, which the acquire's answer v showed free with
// another token's place at the head of its queue, to that place, as a
// release would: the place may be one its process forgot (an acquire
// applied after its clean-up release), which would otherwise hold up the
// queue for as long as its lease lives (the presence's: the process's
// life). It reports whether the grant was written.
func (s *Store) handToHead(ctx context.Context, key string, v keyView) bool {
	var head *mvccpb.KeyValue
	for _, kv := range v.entries {
		if head == nil || kv.CreateRevision < head.CreateRevision {
			head = kv
		}
	}
	next := s.entryHead(key, head)
	if next == nil {
		return false
	}
	k := s.lockKey(key)
	qs, qe := s.queueRange(key)
	guard := append(headCmps(clientv3.Compare(clientv3.CreateRevision(k), "=", 0), next.key, next.rev, qs, qe),
		clientv3.Compare(clientv3.LeaseValue(next.key), "=", next.lease))
	// No fence in the value: the new key's create revision is above every earlier one.
	grant := []clientv3.Op{clientv3.OpPut(k, lockValue(next.token, next.ttl, next.holder, 0), clientv3.WithLease(next.lease)), clientv3.OpDelete(next.key)}
	resp, err := s.txn(ctx, key, guard, grant, nil, false)
	return err == nil && resp.Succeeded
}

// wrapLease is wrap for a request that wrote on leases ids; a lease etcd
// does not know (revoked by someone else) is no longer used.
func (s *Store) wrapLease(ctx context.Context, op, key string, err error, ids ...clientv3.LeaseID) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		for _, id := range ids {
			s.sess.leases.expired(id)
		}
	}
	return s.wrap(ctx, op, key, err)
}

// takeoverSlack is how early before its takeover a head's acquire may come
// and wait for it (waitUntil) rather than be refused.
const takeoverSlack = 2 * time.Millisecond

// takeoverEarly is how early the head is told to come back (Grant.Remaining)
// and woken by its watch, to absorb a late timer; below takeoverSlack.
const takeoverEarly = 1500 * time.Microsecond

// waitUntil returns true at 'at', within microseconds, or false when ctx
// ends first: a timer until takeoverEarly before, then yielding the processor.
func waitUntil(ctx context.Context, at time.Time) bool {
	if d := time.Until(at) - takeoverEarly; d > 0 && !sleep(ctx, d) {
		return false
	}
	for time.Now().Before(at) {
		if ctx.Err() != nil {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// sleep returns true after d, or false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// tryTakeOver takes the lock when req's token heads its queue and has seen
// the lock unchanged for its TTL (session.takeoverAt), in one transaction
// guarded by the lock's mod revision, the token's entry and its place at the
// head. The new lock's fence, in its value, is that mod revision plus one:
// above every earlier fence of the key. done is false when the lock is not
// known to be expired (nothing sent) or the guard failed.
func (s *Store) tryTakeOver(ctx context.Context, req driver.AcquireRequest, l clientv3.LeaseID) (g driver.Grant, done bool, err error) {
	r := ref{req.Key, req.Token}
	mod, entry, at, known := s.sess.takeoverAt(r)
	if !known || time.Until(at) > takeoverSlack || !waitUntil(ctx, at) {
		return g, false, nil
	}
	k, e := s.lockKey(r.key), s.entryKey(r.key, r.token)
	qs, qe := s.queueRange(r.key)
	resp, err := s.cli.Txn(ctx).
		If(headCmps(clientv3.Compare(clientv3.ModRevision(k), "=", mod), e, entry, qs, qe)...).
		Then(clientv3.OpPut(k, lockValue(req.Token, req.TTL, req.Holder, mod+1), clientv3.WithLease(l)),
			clientv3.OpDelete(e)).
		Commit()
	switch {
	case err != nil: // it may have applied: tracked as after an acquire
		s.sess.track(s.sess.held, r, req.TTL)
		return g, true, s.wrapLease(ctx, "acquire", req.Key, err, l)
	case !resp.Succeeded:
		return g, false, nil
	}
	s.sess.took(r, req.TTL, 0, nil)
	return driver.Grant{Fence: uint64(mod + 1)}, true, nil
}

// rewrite returns the value a retried acquire or renewal with ttl writes
// over token's lock (prev; a permit: token "") when it changed the TTL,
// which waiters time a takeover by, keeping its fence; "" if the same TTL.
func rewrite(token string, ttl time.Duration, prev *mvccpb.KeyValue) string {
	_, was, holder, fence, _ := lockFields(prev.GetValue())
	if was == ttl {
		return ""
	}
	return lockValue(token, ttl, holder, fence)
}

// retried finishes an acquire or renewal (op on key) that moved etcd key k
// (a lock or permit) to l at revision rev: it writes v, k's rewrite, if any.
func (s *Store) retried(ctx context.Context, op, key, k string, l clientv3.LeaseID, v string, rev int64) error {
	if v == "" {
		return nil
	}
	rctx, cancel := s.request(ctx, false) // after a wait in the batch queue
	defer cancel()
	resp, err := s.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
		Then(clientv3.OpPut(k, v, clientv3.WithLease(l))).
		Commit()
	switch {
	case err != nil:
		return s.wrapLease(ctx, op, key, err, l)
	case !resp.Succeeded:
		return leasehold.ErrNotOwned // it changed meanwhile: released, expired or taken
	}
	return nil
}

// acquireTxn sends req's acquire transaction, shaped by what the store
// knows of the token (st): the retry check only when it may own the lock.
func (s *Store) acquireTxn(ctx context.Context, req driver.AcquireRequest, l, ql clientv3.LeaseID, st standing) (*clientv3.TxnResponse, error) {
	k := s.lockKey(req.Key)
	e := s.entryKey(req.Key, req.Token)
	qs, qe := s.queueRange(req.Key)
	ks, ke := s.keyRange(req.Key)
	// Free: no lock and no queue, one comparison over the key's range.
	free := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ks), "=", 0).WithRange(ke)}
	if st.rev > 0 { // or no lock, and we head the queue: every entry is ours or younger
		free = headCmps(clientv3.Compare(clientv3.CreateRevision(k), "=", 0), e, st.rev, qs, qe)
	}
	var lost []clientv3.Op
	if ql != 0 { // a rewrite keeps the entry's create revision: its place
		lost = append(lost, s.keepEntry(e, clientv3.OpPut(e, entryValue(req.Holder, min(req.TTL, req.QueueTTL)), clientv3.WithLease(ql))))
	}
	lost = append(lost, clientv3.OpGet(ks, clientv3.WithRange(ke)))
	take := []clientv3.Op{clientv3.OpPut(k, lockValue(req.Token, req.TTL, req.Holder, 0), clientv3.WithLease(l))}
	if st.mayQueue {
		take = append(take, clientv3.OpDelete(e)) // our queue entry, if any
	}
	if st.rev > 0 { // others may wait behind us: the next head, for Release
		take = append(take, headRead(qs, qe))
	}
	if !st.mayOwn {
		return s.txn(ctx, req.Key, free, take, lost, false)
	}
	ours, keep := moveLock(k, req.Token, l)
	if st.grantMod > 0 { // a grant as the watch saw it: rewritten whole (its TTL), and the next head read
		ours = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", st.grantMod)}
		keep = []clientv3.Op{clientv3.OpPut(k, lockValue(req.Token, req.TTL, req.Holder, st.fence), clientv3.WithLease(l)), headRead(qs, qe)}
	}
	return s.txn(ctx, req.Key, free, take, []clientv3.Op{clientv3.OpTxn(ours, keep, lost)}, st.grantMod > 0) // a grant's: first
}

// moveLock moves lock k, when it holds token, to lease l (a retried acquire
// or a renewal); the value stays: it may carry the fence.
func moveLock(k, token string, l clientv3.LeaseID) ([]clientv3.Cmp, []clientv3.Op) {
	return mine(k, token), []clientv3.Op{clientv3.OpPut(k, "", clientv3.WithIgnoreValue(), clientv3.WithLease(l), clientv3.WithPrevKV())}
}

// keyView is what a read of a key's range shows: the lock and the queue.
type keyView struct {
	rev     int64
	lock    *mvccpb.KeyValue            // nil: free
	myRev   int64                       // the token's queue entry, 0 if none
	ahead   int                         // entries older than the token's (all, if none)
	entries map[string]*mvccpb.KeyValue // the queue: entry key -> key-value
}

// view decodes the kvs of keyRange(key) as seen by token at revision rev.
func (s *Store) view(key, token string, kvs []*mvccpb.KeyValue, rev int64) keyView {
	v := keyView{rev: rev, entries: map[string]*mvccpb.KeyValue{}}
	for _, kv := range kvs {
		v.entries[string(kv.Key)] = kv
	}
	v.lock = v.entries[s.lockKey(key)]
	delete(v.entries, s.lockKey(key))
	v.myRev = v.entries[s.entryKey(key, token)].GetCreateRevision()
	for _, kv := range v.entries {
		if v.myRev == 0 || kv.CreateRevision < v.myRev {
			v.ahead++
		}
	}
	return v
}

// contended builds the Grant of a lost acquire. left is the lock's time
// left by this store's clock for a waiter (session.setQueue), < 0 unknown.
func (s *Store) contended(ctx context.Context, req driver.AcquireRequest, v keyView, left time.Duration) driver.Grant {
	g := driver.Grant{Ahead: v.ahead}
	if v.lock == nil {
		return g
	}
	_, ttl, holder, _, _ := lockFields(v.lock.Value)
	g.Holder, g.Remaining = holder, ttl
	if left >= 0 && ttl > 0 {
		// The head retries then and takes over; 0 would read as "free".
		g.Remaining = max(left, time.Millisecond)
	}
	if req.QueueTTL == 0 && v.lock.Lease != 0 { // a try: the lease's time left
		g.Remaining = s.remaining(ctx, clientv3.LeaseID(v.lock.Lease), ttl, 0)
	}
	return g
}

// remaining returns the time left on lease id (whole seconds, rounded
// down), capped by ttl > 0: floor when under a second, 0 when gone or unknown.
func (s *Store) remaining(ctx context.Context, id clientv3.LeaseID, ttl, floor time.Duration) time.Duration {
	rctx, cancel := s.request(ctx, false) // after a wait in the batch queue
	defer cancel()
	r, err := s.cli.TimeToLive(rctx, id)
	switch {
	case err != nil || r.TTL < 0:
		return 0
	case r.TTL == 0:
		return floor
	}
	d := time.Duration(r.TTL) * time.Second
	if ttl > 0 {
		d = min(d, ttl)
	}
	return d
}

// Renew implements driver.Store: one token-checked transaction moves the
// lock to the current lease of ttl, keeping its fence, or answers
// ErrNotOwned; a second rewrites the value when the TTL changed. The write
// moves the lock's mod revision: waiters see the holder alive.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.RenewBatch(ctx, []driver.RenewRequest{{Key: key, Token: token, TTL: ttl}})[0]
}

// maxTxnOps stays under etcd's default --max-txn-ops (128).
const maxTxnOps = 128

// RenewBatch implements driver.BatchRenewer: one transaction renews up
// to maxTxnOps/2 locks (a nested transaction each, as Renew), plus one per
// lock whose TTL changed.
func (s *Store) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	errs := make([]error, len(reqs))
	var chunk []int
	keys := map[string]bool{}
	for i, r := range reqs {
		if errs[i] = checkRequest(r.Key, r.Token, "", r.TTL); errs[i] != nil {
			continue
		}
		if len(chunk) == maxTxnOps/2 || keys[r.Key] { // etcd refuses a key twice in one transaction
			s.renewChunk(ctx, reqs, chunk, errs)
			chunk, keys = nil, map[string]bool{}
		}
		chunk, keys[r.Key] = append(chunk, i), true
	}
	if len(chunk) > 0 {
		s.renewChunk(ctx, reqs, chunk, errs)
	}
	return errs
}

// renewChunk renews reqs[i] for every i in chunk, in one transaction.
func (s *Store) renewChunk(parent context.Context, reqs []driver.RenewRequest, chunk []int, errs []error) {
	fail := func(err error) { setAll(errs, chunk, err) }
	ctx, end, err := s.begin(parent)
	if err != nil {
		fail(err)
		return
	}
	defer end()
	ids := map[time.Duration]clientv3.LeaseID{}
	ops := make([]clientv3.Op, len(chunk))
	for j, i := range chunk {
		r := reqs[i]
		id, ok := ids[r.TTL]
		if !ok {
			if id, err = s.sess.leases.get(ctx, r.TTL); err != nil {
				fail(s.wrap(ctx, "renew", r.Key, err))
				return
			}
			ids[r.TTL] = id
		}
		ours, move := moveLock(s.lockKey(r.Key), r.Token, id)
		ops[j] = clientv3.OpTxn(ours, move, nil)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		fail(s.wrapLease(ctx, "renew", reqs[chunk[0]].Key, err, slices.Collect(maps.Values(ids))...))
		return
	}
	for j, i := range chunk {
		r := reqs[i]
		inner := resp.Responses[j].GetResponseTxn()
		if !inner.GetSucceeded() {
			errs[i] = leasehold.ErrNotOwned
			continue
		}
		v := rewrite(r.Token, r.TTL, inner.GetResponses()[0].GetResponsePut().GetPrevKv())
		mod := resp.Header.Revision // for Release; unknown after a rewrite
		if v != "" {
			mod = 0
		}
		s.sess.moved(ref{r.Key, r.Token}, mod)
		errs[i] = s.retried(ctx, "renew", r.Key, s.lockKey(r.Key), ids[r.TTL], v, resp.Header.Revision)
	}
}

// Release implements driver.Store: it deletes the lock if it holds
// token and nobody waits, and the token's queue entry when this store
// queued it. When someone waits it hands the key to the head of the queue
// (a driver.Wake with the grant), guarded as a takeover: one transaction when the
// store knows the head, else a read and then the grant; but while a full
// batch of the store's transactions waits, a release that does not know
// the head deletes the lock, and the head takes the key itself.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkNames(key, token, ""); err != nil {
		return err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	r := ref{key, token}
	var own []clientv3.Op
	if s.sess.standingOf(r).mayQueue { // our queue entry: a waiter leaves
		own = append(own, clientv3.OpDelete(s.entryKey(key, token)))
	}
	mod, next := s.sess.headOf(r)
	// A head this store does not know is read, then granted; while a full
	// batch waits (a release-all), the lock is deleted instead, and the
	// head, woken by its watch, takes the key with one acquire: two
	// transactions a key, not three (with the granted waiter's acquire).
	plain := next == nil && s.rel.busy()
	for attempt := 0; ; attempt++ {
		rs, done, err := s.releaseOnce(ctx, key, token, own, mod, next, plain || attempt >= 3, attempt > 0)
		switch {
		case done:
			s.sess.forget(r)
			return err
		case err != nil:
			return s.wrap(ctx, "release", key, err)
		}
		// Someone waits (rs read the lock and the queue head): grant it, or
		// delete when the head cannot be granted.
		mod, next = 0, s.headOf(key, rs)
		if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			mod = kvs[0].ModRevision
		}
		plain = next == nil
	}
}

// releaseOnce sends one release transaction, token-checked: it grants the
// lock to next (when known, guarded by mod), or deletes it if the queue is
// empty (or plain), or else reads the lock and the queue head. It returns
// what releasedBy does, or the transaction's error (not done).
func (s *Store) releaseOnce(ctx context.Context, key, token string, own []clientv3.Op, mod int64, next *headEntry, plain, again bool) ([]*etcdserverpb.ResponseOp, bool, error) {
	k := s.lockKey(key)
	qs, qe := s.queueRange(key)
	free := append([]clientv3.Op{clientv3.OpDelete(k)}, own...)
	reads := []clientv3.Op{clientv3.OpGet(k), headRead(qs, qe)}
	empty := clientv3.Compare(clientv3.CreateRevision(qs), "=", 0).WithRange(qe)
	granting := !plain && mod > 0 && next != nil && next.token != token
	cmps, then, els := mine(k, token), free, append([]clientv3.Op{clientv3.OpGet(k, clientv3.WithCountOnly())}, own...)
	switch {
	case granting:
		grant := append([]clientv3.Op{
			clientv3.OpPut(k, lockValue(next.token, next.ttl, next.holder, mod+1), clientv3.WithLease(next.lease)),
			clientv3.OpDelete(next.key)}, own...)
		// The entry's lease as read: a refresh since moved it to a newer one
		// (the old may be gone, failing the whole request, or end sooner).
		guard := append(headCmps(clientv3.Compare(clientv3.ModRevision(k), "=", mod), next.key, next.rev, qs, qe),
			clientv3.Compare(clientv3.LeaseValue(next.key), "=", next.lease))
		then = []clientv3.Op{clientv3.OpTxn(guard, grant, []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{empty}, free, reads)})}
	case !plain: // nobody waits: delete; else read (the token is checked on the answer)
		if mod > 0 { // the lock as our acquire or a grant wrote it
			cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", mod)}
		}
		cmps, els = append(cmps, empty), append(reads, own...)
	}
	// A grant after a read goes first: its release waited once already.
	resp, err := s.txn(ctx, key, cmps, then, els, again)
	if err != nil {
		return nil, false, err
	}
	return releasedBy(token, resp, granting || plain)
}

// releasedBy decodes the answer of releaseOnce (checked: its compare was
// the token's): done with nil, ErrNotHeld or ErrNotOwned, or, when someone
// waits, the reads of the lock and the queue head, to grant next.
func releasedBy(token string, resp *clientv3.TxnResponse, checked bool) (rs []*etcdserverpb.ResponseOp, done bool, err error) {
	rs = resp.Responses
	if !resp.Succeeded { // rs[0] read the lock
		lock := rs[0].GetResponseRange()
		switch {
		case lock.GetCount() == 0:
			return nil, true, leasehold.ErrNotHeld
		case checked || !ownedBy(lock.GetKvs()[0], token):
			return nil, true, leasehold.ErrNotOwned
		}
		return rs, false, nil // ours, and someone waits
	}
	if inner := rs[0].GetResponseTxn(); inner != nil && !inner.GetSucceeded() { // not granted
		if rest := inner.GetResponses()[0].GetResponseTxn(); !rest.GetSucceeded() {
			return rest.GetResponses(), false, nil
		}
	}
	return nil, true, nil // deleted, or granted to the head
}

// headCmps guard a write for queue entry e at create revision rev: the lock
// compare c, e still there and still the oldest entry of [qs, qe).
func headCmps(c clientv3.Cmp, e string, rev int64, qs, qe string) []clientv3.Cmp {
	return []clientv3.Cmp{c,
		clientv3.Compare(clientv3.CreateRevision(e), "=", rev),
		clientv3.Compare(clientv3.CreateRevision(qs), ">", rev-1).WithRange(qe),
	}
}

// headRead reads the oldest entry of the queue range [qs, qe).
func headRead(qs, qe string) clientv3.Op {
	return clientv3.OpGet(qs, clientv3.WithRange(qe),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
}

// headOf decodes the queue head of key from the last range response among
// rs (a headRead), nil when the queue is empty or the head cannot be granted.
func (s *Store) headOf(key string, rs []*etcdserverpb.ResponseOp) *headEntry {
	var kvs []*mvccpb.KeyValue
	for _, r := range rs {
		if rng := r.GetResponseRange(); rng != nil {
			kvs = rng.GetKvs()
		}
	}
	if len(kvs) == 0 {
		return nil
	}
	return s.entryHead(key, kvs[0])
}

// entryHead decodes queue entry kv of key as the head to grant; nil when it
// cannot be granted (no TTL or no lease).
func (s *Store) entryHead(key string, kv *mvccpb.KeyValue) *headEntry {
	qs, _ := s.queueRange(key)
	holder, ttl := entryFields(kv.Value)
	tok, ok := strings.CutPrefix(string(kv.Key), qs)
	if !ok || ttl <= 0 || kv.Lease == 0 {
		return nil
	}
	return &headEntry{key: string(kv.Key), token: tok, rev: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease), holder: holder, ttl: ttl}
}
