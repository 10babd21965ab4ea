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

// semState is one read of a semaphore.
type semState struct {
	holders  []*mvccpb.KeyValue // by create revision
	queue    []*mvccpb.KeyValue // by create revision
	guardRev int64              // mod revision of the guard, 0 if absent
	limit    int
	rev      int64 // the revision of the read
}

func (st *semState) holder(tok string, hp string) *mvccpb.KeyValue {
	for _, kv := range st.holders {
		if string(kv.Key) == hp+tok {
			return kv
		}
	}
	return nil
}

// position returns tok's index in the queue and the number of waiters ahead
// (the whole queue when tok is absent).
func (st *semState) position(tok, qp string) (int, int) {
	for i, kv := range st.queue {
		if string(kv.Key) == qp+tok {
			return i, i
		}
	}
	return -1, len(st.queue)
}

// semReads read a semaphore's holders, waiters and guard under prefix p;
// the Else branch of a grant, so that one that lost brings the state back.
func semReads(p string) []clientv3.Op {
	byCreate := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	return []clientv3.Op{clientv3.OpGet(p+"h/", byCreate...), clientv3.OpGet(p+"q/", byCreate...), clientv3.OpGet(p + "g")}
}

// readSem reads holders, waiters and guard in one transaction.
func (s *Store) readSem(ctx context.Context, key string) (semState, error) {
	resp, err := s.cli.Txn(ctx).Then(semReads(s.SemaphorePrefix(key))...).Commit()
	if err != nil {
		return semState{}, err
	}
	return semStateOf(resp), nil
}

// semStateOf decodes the responses of semReads.
func semStateOf(resp *clientv3.TxnResponse) semState {
	st := semState{
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

// AcquirePermit implements driver.Semaphorer: a grant in a transaction
// that requires the guard unchanged since the store's read or bound
// (semBounds), retried with jitter up to maxPermitRetries times, then
// ErrNotAcquired. The fence is the holder key's create revision.
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
	pa := &permitAttempt{s: s, req: req, id: id}
	for attempt := range maxPermitRetries {
		g, done, err := pa.try(ctx)
		if err != nil || done {
			return g, err
		}
		// Another acquirer got in between: back off up to 16 ms, at random.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 4))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return driver.Grant{}, s.wrap(ctx, "acquire permit", req.Key, context.Cause(ctx))
		}
	}
	return driver.Grant{}, fmt.Errorf("%w: etcdstore: semaphore %q changed under each of %d attempts by other acquirers",
		leasehold.ErrNotAcquired, req.Key, maxPermitRetries)
}

// permitAttempt is one AcquirePermit: its request and the lease for its TTL.
type permitAttempt struct {
	s    *Store
	req  driver.PermitRequest
	id   clientv3.LeaseID
	next *semState // what a transaction that lost brought back, for the next try
}

// try makes one attempt; done is false when the semaphore changed between
// the read and the transaction.
func (pa *permitAttempt) try(ctx context.Context) (driver.Grant, bool, error) {
	st, g, done, err := pa.state(ctx)
	if done {
		return g, true, err
	}
	s, req := pa.s, pa.req
	p := s.SemaphorePrefix(req.Key)
	hk, qk := p+"h/"+req.Token, p+"q/"+req.Token
	s.sems.set(req.Key, semBound{guardRev: st.guardRev, holders: len(st.holders), queued: len(st.queue)})
	mine := st.holder(req.Token, p+"h/")
	pos, ahead := st.position(req.Token, p+"q/")
	if mine == nil && ahead >= req.Limit-len(st.holders) {
		if g, done, ok, err := pa.takeOver(ctx, st, pos, ahead); ok {
			return g, done, err
		}
		return pa.refused(ctx, st, pos, ahead)
	}
	grant := pa.grantOps(p)
	if mine != nil {
		// Our own retry: move the key to this lease, keeping the fence.
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(hk), "=", mine.ModRevision)).
			Then(grant[0], clientv3.OpDelete(qk)).
			Commit()
		if err != nil {
			return driver.Grant{}, true, s.wrap(ctx, "acquire permit", req.Key, err)
		}
		return driver.Grant{Fence: uint64(mine.CreateRevision)}, resp.Succeeded, nil
	}
	resp, err := s.cli.Txn(ctx).
		If(grantCmps(p, hk, st.guardRev, st.rev)...).
		Then(append(grant, clientv3.OpDelete(qk))...).
		Else(semReads(p)...).
		Commit()
	if err != nil {
		return driver.Grant{}, true, s.wrap(ctx, "acquire permit", req.Key, err)
	}
	if !resp.Succeeded {
		next := semStateOf(resp)
		pa.next = &next
		return driver.Grant{}, false, nil
	}
	queued := len(st.queue)
	if pos >= 0 {
		queued--
		s.sems.forget(ref{req.Key, req.Token})
	}
	s.sems.set(req.Key, semBound{guardRev: resp.Header.Revision, holders: len(st.holders) + 1, queued: queued})
	return driver.Grant{Fence: uint64(resp.Header.Revision)}, true, nil
}

// grantOps write the token's holder key and the guard under prefix p, on
// the lease of the permit's TTL.
func (pa *permitAttempt) grantOps(p string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpPut(p+"h/"+pa.req.Token, permitValue(pa.req.TTL, pa.req.Holder), clientv3.WithLease(pa.id)),
		clientv3.OpPut(p+"g", strconv.Itoa(pa.req.Limit), clientv3.WithLease(pa.id)),
	}
}

// grantCmps are the conditions of a grant read at revision rev with the
// guard at guardRev: the guard unchanged and no holder key for the token.
func grantCmps(p, hk string, guardRev, rev int64) []clientv3.Cmp {
	return append(unchangedCmps(p, guardRev, rev), clientv3.Compare(clientv3.CreateRevision(hk), "=", 0))
}

// unchangedCmps hold when no holder or waiter joined the semaphore under p
// since a read at revision rev that saw the guard at guardRev. An absent
// guard (0) can come and go again, so then every holder and waiter key must
// also be no newer than rev.
func unchangedCmps(p string, guardRev, rev int64) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(p+"g"), "=", guardRev)}
	if guardRev == 0 {
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(p+"h/"), "<", rev+1).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(p+"q/"), "<", rev+1).WithPrefix())
	}
	return cmps
}

// permitValue is a holder key's value: NUL ttl-in-ms NUL holder (the leading
// NUL tells it from a bare identity, as an earlier version wrote).
func permitValue(ttl time.Duration, holder string) string {
	return "\x00" + strconv.FormatInt(ttl.Milliseconds(), 10) + "\x00" + holder
}

// permitFields decodes a holder key's value; ttl is 0 when unknown.
func permitFields(v []byte) (ttl time.Duration, holder string) {
	rest, ok := strings.CutPrefix(string(v), "\x00")
	if !ok {
		return 0, string(v)
	}
	ms, holder, _ := strings.Cut(rest, "\x00")
	if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 {
		ttl = time.Duration(n) * time.Millisecond
	}
	return ttl, holder
}

// state returns the semaphore for a try: what a losing transaction brought
// back, else tryBound's outcome (done when it won), else a read.
func (pa *permitAttempt) state(ctx context.Context) (semState, driver.Grant, bool, error) {
	if st := pa.next; st != nil {
		pa.next = nil
		return *st, driver.Grant{}, false, nil
	}
	g, done, err := pa.tryBound(ctx)
	if done || err != nil {
		return semState{}, g, true, err
	}
	if st := pa.next; st != nil {
		pa.next = nil
		return *st, driver.Grant{}, false, nil
	}
	st, err := pa.s.readSem(ctx, pa.req.Key)
	if err != nil {
		return semState{}, driver.Grant{}, true, pa.s.wrap(ctx, "acquire permit", pa.req.Key, err)
	}
	return st, driver.Grant{}, false, nil
}

// tryBound grants without a read when the store's bound shows a free permit
// and no waiter. done is false when there is no such bound or the guard
// changed (the semaphore is then in pa.next).
func (pa *permitAttempt) tryBound(ctx context.Context) (driver.Grant, bool, error) {
	s, req := pa.s, pa.req
	b, ok := s.sems.get(req.Key)
	if !ok || b.guardRev == 0 || b.queued > 0 || b.holders >= req.Limit {
		return driver.Grant{}, false, nil
	}
	p := s.SemaphorePrefix(req.Key)
	hk, gk := p+"h/"+req.Token, p+"g"
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(gk), "=", b.guardRev), clientv3.Compare(clientv3.CreateRevision(hk), "=", 0)).
		Then(pa.grantOps(p)...).
		Else(semReads(p)...).
		Commit()
	switch {
	case err != nil:
		return driver.Grant{}, true, s.wrap(ctx, "acquire permit", req.Key, err)
	case !resp.Succeeded:
		s.sems.drop(req.Key)
		next := semStateOf(resp)
		pa.next = &next
		return driver.Grant{}, false, nil
	}
	s.sems.set(req.Key, semBound{guardRev: resp.Header.Revision, holders: b.holders + 1})
	return driver.Grant{Fence: uint64(resp.Header.Revision)}, true, nil
}

// semBound is an upper bound of a semaphore's live holders and waiters,
// valid while the guard's mod revision is guardRev.
type semBound struct {
	guardRev        int64
	holders, queued int
}

// semBounds remembers, per key, what this store last read or wrote of a
// semaphore, so that an uncontended AcquirePermit needs no read. Only grants
// and new waiters add keys, and both rewrite the guard: while its mod
// revision is the recorded one, the counts stay upper bounds. A bound with
// no guard (revision 0) is never used.
type semBounds struct {
	mu     sync.Mutex
	m      map[string]semBound
	sights permitSights // see takeOver
}

// maxSemBounds bounds the memory of semBounds: past it, the map is cleared.
const maxSemBounds = 4096

func (c *semBounds) get(key string) (semBound, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[key]
	return b, ok
}

func (c *semBounds) set(key string, b semBound) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxSemBounds {
		c.m = make(map[string]semBound)
	}
	c.m[key] = b
}

func (c *semBounds) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// released lowers the holders' bound after this store deleted a live permit.
func (c *semBounds) released(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.m[key]; ok && b.holders > 0 {
		b.holders--
		c.m[key] = b
	}
}

// refused queues a waiting token and describes the contention.
func (pa *permitAttempt) refused(ctx context.Context, st semState, pos, ahead int) (driver.Grant, bool, error) {
	s, req := pa.s, pa.req
	if req.QueueTTL > 0 {
		ok, next, err := s.queue(ctx, req, st, pos)
		if err != nil || !ok {
			pa.next = next
			return driver.Grant{}, ok, err
		}
	}
	g := driver.Grant{Ahead: ahead}
	if len(st.holders) >= req.Limit && len(st.holders) > 0 {
		first := st.holders[0]
		var ttl time.Duration
		ttl, g.Holder = permitFields(first.Value)
		g.Remaining = s.remaining(ctx, clientv3.LeaseID(first.Lease), ttl, time.Millisecond)
		if left, ok := s.sems.firstExpiry(ref{req.Key, req.Token}, st, time.Now()); ok && req.QueueTTL > 0 {
			// A waiter retries when the next holder runs out of its TTL.
			g.Remaining = max(left, time.Millisecond)
		}
	}
	return g, true, leasehold.ErrNotAcquired
}

// queue appends req.Token to the queue on the current lease of the queue TTL,
// rewriting the guard so that no grant read before overtakes it, or moves its
// entry to that lease, keeping its place. ok is false when the semaphore
// changed since st; next is then the semaphore now, when known.
func (s *Store) queue(ctx context.Context, req driver.PermitRequest, st semState, pos int) (ok bool, next *semState, err error) {
	p := s.SemaphorePrefix(req.Key)
	qk, gk := p+"q/"+req.Token, p+"g"
	qid, err := s.sess.leases.get(ctx, req.QueueTTL)
	if err != nil {
		return true, nil, s.wrap(ctx, "acquire permit", req.Key, err)
	}
	if pos >= 0 {
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(qk), "=", st.queue[pos].CreateRevision)).
			Then(clientv3.OpPut(qk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(qid))).
			Commit()
		if err != nil {
			return true, nil, s.wrapLease(ctx, "acquire permit", req.Key, err, qid)
		}
		return resp.Succeeded, nil, nil // not: the entry just expired, join again
	}
	resp, err := s.cli.Txn(ctx).
		If(append(unchangedCmps(p, st.guardRev, st.rev), clientv3.Compare(clientv3.CreateRevision(qk), "=", 0))...).
		Then(clientv3.OpPut(qk, req.Holder, clientv3.WithLease(qid)), clientv3.OpPut(gk, strconv.Itoa(req.Limit), clientv3.WithLease(qid)),
			clientv3.OpGet(p+"h/", clientv3.WithPrefix())).
		Else(semReads(p)...).
		Commit()
	if err != nil {
		return true, nil, s.wrapLease(ctx, "acquire permit", req.Key, err, qid)
	}
	s.sems.drop(req.Key) // the guard changed
	if !resp.Succeeded {
		st := semStateOf(resp)
		return false, &st, nil
	}
	// The holders at the entry's creation: the first sights (takeOver).
	now := time.Now()
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		ttl, _ := permitFields(kv.Value)
		s.sems.saw(ref{req.Key, req.Token}, resp.Header.Revision, string(kv.Key), kv.ModRevision, now, ttl)
	}
	return true, nil, nil
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
	p := s.SemaphorePrefix(key)
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpDelete(p+"h/"+token), clientv3.OpDelete(p+"q/"+token)).Commit()
	if err != nil {
		return s.wrap(ctx, "release permit", key, err)
	}
	s.sems.forget(ref{key, token})
	if resp.Responses[0].GetResponseDeleteRange().GetDeleted() == 0 {
		return leasehold.ErrNotHeld
	}
	s.sems.released(key)
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
	m.saw = func(hk string, entry, mod int64, ttl time.Duration) {
		s.sems.saw(ref{key, token}, entry, hk, mod, time.Now(), ttl)
	}
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
			if wr.Err() != nil || m.apply(wr.Events) {
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

// permitModel is one WaitPermit's view of a semaphore, owned by its watch
// goroutine after WaitPermit returns.
type permitModel struct {
	hp, qp, gk string
	me         string // the token's queue entry key
	holders    map[string]struct{}
	queue      map[string]int64 // entry key -> create revision
	limit      int              // 0 until a guard was seen
	was        bool             // the turn had come at the last check
	// saw records a holder write newer than the token's entry (takeOver).
	saw func(hk string, entry, mod int64, ttl time.Duration)
}

func newPermitModel(p, token string, st semState) *permitModel {
	m := &permitModel{
		hp: p + "h/", qp: p + "q/", gk: p + "g", me: p + "q/" + token,
		holders: make(map[string]struct{}, len(st.holders)), queue: make(map[string]int64, len(st.queue)),
		limit: st.limit,
	}
	for _, kv := range st.holders {
		m.holders[string(kv.Key)] = struct{}{}
	}
	for _, kv := range st.queue {
		m.queue[string(kv.Key)] = kv.CreateRevision
	}
	m.was = m.turn()
	return m
}

// sawHolder passes a holder write to saw when the token's entry is older.
func (m *permitModel) sawHolder(kv *mvccpb.KeyValue) {
	if e, ok := m.queue[m.me]; ok && e < kv.ModRevision && m.saw != nil {
		ttl, _ := permitFields(kv.Value)
		m.saw(string(kv.Key), e, kv.ModRevision, ttl)
	}
}

// turn reports whether fewer waiters are ahead of the token than permits
// are free.
func (m *permitModel) turn() bool {
	if m.limit <= 0 {
		return false
	}
	ahead := len(m.queue)
	if rev, ok := m.queue[m.me]; ok {
		ahead = 0
		for _, r := range m.queue {
			if r < rev {
				ahead++
			}
		}
	}
	return ahead < m.limit-len(m.holders)
}

// apply applies watch events and reports whether the token's turn came
// with them (or, with no limit known, whether anything was deleted).
func (m *permitModel) apply(evs []*clientv3.Event) bool {
	freed := false // a holder or a waiter left
	for _, ev := range evs {
		k, put := string(ev.Kv.Key), ev.Type == mvccpb.PUT
		switch {
		case strings.HasPrefix(k, m.hp) && put:
			m.holders[k] = struct{}{}
			m.sawHolder(ev.Kv)
		case strings.HasPrefix(k, m.hp):
			delete(m.holders, k)
			freed = true
		case strings.HasPrefix(k, m.qp) && put:
			m.queue[k] = ev.Kv.CreateRevision
		case strings.HasPrefix(k, m.qp):
			delete(m.queue, k)
			freed = true
		case k == m.gk && put:
			m.limit, _ = strconv.Atoi(string(ev.Kv.Value))
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

// permitSights is what this store's waiters saw of their semaphores'
// holders, by waiter: a holder seen at one mod revision for its whole TTL,
// while the waiter's entry stayed, is taken over as a lock would be.
type permitSights map[ref]*waiterSight

// waiterSight is one waiter's record: its queue entry's create revision,
// and per holder key the first sight of its current mod revision.
type waiterSight struct {
	entry   int64
	holders map[string]holderSight
}

type holderSight struct {
	mod int64
	at  time.Time
	ttl time.Duration
}

// maxSights bounds the waiters recorded: past it, the record is cleared.
const maxSights = 4096

// saw records that waiter r, with its queue entry at create revision entry,
// saw holder key hk at mod revision mod (TTL ttl) at time at.
func (c *semBounds) saw(r ref, entry int64, hk string, mod int64, at time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sights == nil || len(c.sights) >= maxSights {
		c.sights = permitSights{}
	}
	w := c.sights[r]
	if w == nil || w.entry != entry {
		w = &waiterSight{entry: entry, holders: map[string]holderSight{}}
		c.sights[r] = w
	}
	if h, ok := w.holders[hk]; ok && h.mod >= mod {
		return // the same write (its first sight counts), or an older one
	}
	w.holders[hk] = holderSight{mod: mod, at: at, ttl: ttl}
}

// expiredHolders returns the holders of st that waiter r (entry at create
// revision entry) has seen unchanged for their whole TTL by now.
func (c *semBounds) expiredHolders(r ref, entry int64, st semState, now time.Time) []*mvccpb.KeyValue {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.sights[r]
	if w == nil || w.entry != entry {
		return nil
	}
	var out []*mvccpb.KeyValue
	for _, kv := range st.holders {
		h, ok := w.holders[string(kv.Key)]
		if ok && h.mod == kv.ModRevision && h.ttl > 0 && !now.Before(h.at.Add(h.ttl)) {
			out = append(out, kv)
		}
	}
	return out
}

// firstExpiry returns how long until the next of st's holders runs out of
// its TTL by waiter r's sights; ok is false when none is known to run out
// after now (a waiter whose turn an expired holder does not free waits for
// the waiters ahead of it, and is woken by WaitPermit).
func (c *semBounds) firstExpiry(r ref, st semState, now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.sights[r]
	if w == nil {
		return 0, false
	}
	var first time.Time
	for _, kv := range st.holders {
		h, ok := w.holders[string(kv.Key)]
		end := h.at.Add(h.ttl)
		if ok && h.ttl > 0 && end.After(now) && (first.IsZero() || end.Before(first)) {
			first = end
		}
	}
	return first.Sub(now), !first.IsZero()
}

// forget drops waiter r's sights.
func (c *semBounds) forget(r ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sights, r)
}

// takeOver records what read st showed of the holders (the waiter's entry
// at index pos) and, when holders seen unchanged for their TTL free a permit
// for it, grants it in one transaction that deletes them, guarded by their
// mod revisions and its entry. ok is false when there is nothing to take
// over; otherwise g, done and err are try's answer.
func (pa *permitAttempt) takeOver(ctx context.Context, st semState, pos, ahead int) (g driver.Grant, done, ok bool, err error) {
	s, req := pa.s, pa.req
	if req.QueueTTL <= 0 || pos < 0 {
		return driver.Grant{}, false, false, nil
	}
	r, entry, now := ref{req.Key, req.Token}, st.queue[pos].CreateRevision, time.Now()
	for _, kv := range st.holders {
		ttl, _ := permitFields(kv.Value)
		s.sems.saw(r, entry, string(kv.Key), kv.ModRevision, now, ttl)
	}
	dead := s.sems.expiredHolders(r, entry, st, now)
	if len(dead) == 0 || ahead >= req.Limit-len(st.holders)+len(dead) {
		return driver.Grant{}, false, false, nil
	}
	p := s.SemaphorePrefix(req.Key)
	hk, qk := p+"h/"+req.Token, p+"q/"+req.Token
	cmps := append(grantCmps(p, hk, st.guardRev, st.rev), clientv3.Compare(clientv3.CreateRevision(qk), "=", entry))
	var ops []clientv3.Op
	for _, kv := range dead {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		ops = append(ops, clientv3.OpDelete(string(kv.Key)))
	}
	ops = append(append(ops, pa.grantOps(p)...), clientv3.OpDelete(qk))
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(semReads(p)...).Commit()
	switch {
	case err != nil:
		return driver.Grant{}, true, true, s.wrap(ctx, "acquire permit", req.Key, err)
	case !resp.Succeeded:
		next := semStateOf(resp)
		pa.next = &next
		return driver.Grant{}, false, true, nil
	}
	s.sems.forget(r)
	s.sems.set(req.Key, semBound{guardRev: resp.Header.Revision, holders: len(st.holders) - len(dead) + 1, queued: len(st.queue) - 1})
	return driver.Grant{Fence: uint64(resp.Header.Revision)}, true, true, nil
}
