package etcdstore

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Timing of the session.
const (
	// leaseSlack is added to a lock's TTL (whole seconds) when its shared
	// lease is granted, so that a keep-alive every keepAliveEvery keeps the
	// lease's server-side expiry beyond now+TTL without a request of its own
	// in Acquire or Renew.
	leaseSlack     = 1 // seconds
	keepAliveEvery = 300 * time.Millisecond
	// tick is how often the session looks for abandoned locks and waiters.
	tick = 50 * time.Millisecond
	// idleRevoke is how long a lease with no lock nor waiter on it is kept
	// alive before it is revoked.
	idleRevoke = 10 * time.Second
	// closeTimeout bounds the revokes of Close.
	closeTimeout = 2 * time.Second
)

// session owns the store's etcd leases and the bookkeeping that bounds how
// long a lock or queue entry on a shared lease can outlive its holder.
//
// One etcd lease serves every lock and queue entry of the store with the
// same TTL in whole seconds, the way an etcd concurrency.Session serves all
// of a process's Mutexes: Acquire and Release are one transaction each, with
// no LeaseGrant or LeaseRevoke per lock. The lease is granted for the TTL
// plus one second and kept alive every 300 ms by the session's goroutine.
//
// Because the lease lives as long as the store keeps it alive, a lock whose
// holder stops renewing it would otherwise live on. The session therefore
// tracks every lock and queue entry the store wrote with a local deadline
// (the lock's TTL after the reply of its last Acquire or Renew; the queue
// TTL after the waiter's last Acquire) and deletes it, token-checked, when
// the deadline passes, again every tick while etcd does not answer (an
// outage shorter than the lease would otherwise leave it on a lease the
// store keeps alive). So a lock outlives its holder's last renewal by at
// most its TTL plus one sweep (50 ms) while the store runs; if the store's
// process dies, hangs or loses etcd, nobody keeps the lease alive and etcd
// deletes everything on it at most TTL+1 s after the last keep-alive.
type session struct {
	s      *Store
	ctx    context.Context // cancelled by close: ends the requests of a round
	cancel context.CancelFunc
	stopc  chan struct{}
	donec  chan struct{}

	mu      sync.Mutex
	leases  map[int64]*lease // by the TTL seconds they serve
	held    map[ref]*tracked // locks
	waiting map[ref]*tracked // queue entries
	swept   map[ref]bool     // locks whose sweep is in flight
	// Sweeps that got no answer from etcd (an outage): the lease may
	// outlive the outage, so they are tried again every tick until etcd
	// answers, the lease is gone, or the token is tracked again.
	retryLocks   map[ref]*tracked
	retryEntries map[ref]*tracked
	isDone       bool
}

// ref names one lock or queue entry: a key and a token.
type ref struct{ key, token string }

// tracked is a lock or queue entry this store wrote.
type tracked struct {
	lease    *lease
	deadline time.Time
	gen      uint64 // bumped by every renewal; a sweep of an older gen loses
	rev      int64  // queue entries: the entry's create revision (0: unknown)
	snap     *queueSnap
	// Queue entries: the lock they wait for, as their acquires saw it. lockMod
	// is the lock's mod revision (0: free or unknown), lockSeen when this
	// store first saw it at that revision with the entry at rev, lockTTL the
	// TTL recorded in it. See takeoverAt.
	lockMod  int64
	lockSeen time.Time
	lockTTL  time.Duration
	// Queue entries: the lock TTL the waiter asked for (a grant's
	// Handoff.TTL).
	reqTTL time.Duration
	// Locks: the lock's mod revision after the acquire that wrote it (0:
	// unknown), and the head of its queue as that acquire saw it (nil:
	// none), for the grant in Release.
	mod  int64
	next *headEntry
}

// headEntry is the head of a key's queue as a read showed it: what a
// release needs to grant it the lock.
type headEntry struct {
	key    string // the entry's etcd key
	token  string
	rev    int64 // its create revision
	lease  clientv3.LeaseID
	holder string
	ttl    time.Duration // the TTL to grant (entryFields)
}

// setHead records the mod revision and queue head an acquire of lock r saw.
func (ss *session) setHead(r ref, mod int64, next *headEntry) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if t := ss.held[r]; t != nil {
		t.mod, t.next = mod, next
	}
}

// headOf returns what setHead recorded for lock r (0, nil if nothing).
func (ss *session) headOf(r ref) (int64, *headEntry) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if t := ss.held[r]; t != nil {
		return t.mod, t.next
	}
	return 0, nil
}

// adopt makes waiter r's entry the lock a release granted it, on the lease
// with the given id (the waiter's queue lease), until ttl from now. It
// returns the TTL the waiter asked for, false when r is not waiting here, the
// lease is not the store's, or it is not known to live ttl from now.
func (ss *session) adopt(r ref, id clientv3.LeaseID, ttl time.Duration) (time.Duration, bool) {
	ss.mu.Lock()
	w := ss.waiting[r]
	var l *lease
	for _, c := range ss.leases {
		// The lease must outlive the lock's TTL from now, as get makes
		// sure for an acquire (else the Locker's acquire does that).
		if c.id == id && !c.dead && c.err == nil && time.Until(c.until) > ttl {
			l = c
			break
		}
	}
	if w == nil || l == nil {
		ss.mu.Unlock()
		return 0, false
	}
	l.refs++
	req := w.reqTTL
	ss.mu.Unlock()
	ss.untrack(ss.waiting, r)
	ss.track(ss.held, r, l, ttl)
	return req, true
}

// queueSnap is what a waiter's last Acquire saw of its key, for WaitRelease.
type queueSnap struct {
	rev     int64         // the revision of the answer
	held    bool          // the lock was held
	lockMod int64         // its mod revision
	lockTTL time.Duration // and the TTL recorded in it (0: unknown)
	lockTok string        // its token and holder
	holder  string
	queue   map[string]int64 // queue entry key -> create revision
	entries map[string]*mvccpb.KeyValue
}

// snapOf makes the queueSnap of a view.
func snapOf(v keyView) *queueSnap {
	q := &queueSnap{rev: v.rev, held: v.held, queue: v.queue, entries: v.entries}
	if v.held {
		q.lockMod = v.lock.ModRevision
		q.lockTok, q.lockTTL, q.holder, _, _ = lockFields(v.lock.Value)
	}
	return q
}

// lease is one shared etcd lease.
type lease struct {
	secs  int64 // the lock TTL it serves
	ready chan struct{}
	// Set before ready is closed:
	id  clientv3.LeaseID
	err error
	// Under session.mu:
	until time.Time // lower bound of the server-side expiry
	refs  int       // locks, queue entries and acquires in flight on it
	idle  time.Time // when refs dropped to 0
	dead  bool
	last  time.Time     // when the last keep-alive was sent
	ka    chan struct{} // closed when the keep-alive in flight is done; nil if none
}

func newSession(s *Store) *session {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session{
		s:       s,
		ctx:     ctx,
		cancel:  cancel,
		stopc:   make(chan struct{}),
		donec:   make(chan struct{}),
		leases:  map[int64]*lease{},
		held:    map[ref]*tracked{},
		waiting: map[ref]*tracked{},
		swept:   map[ref]bool{},

		retryLocks:   map[ref]*tracked{},
		retryEntries: map[ref]*tracked{},
	}
	go ss.run()
	return ss
}

func (ss *session) closed() bool {
	select {
	case <-ss.stopc:
		return true
	default:
		return false
	}
}

// get returns the lease for secs with a reference taken, granting it if
// needed, and makes sure its server-side expiry is at least need from now
// (one keep-alive when the background ones fell behind). Call put when the
// reference is no longer used.
func (ss *session) get(ctx context.Context, secs int64, need time.Duration) (*lease, error) {
	for range 2 {
		l, err := ss.lookup(ctx, secs)
		if err != nil {
			return nil, err
		}
		err = ss.cover(ctx, l, need)
		if err == nil {
			return l, nil
		}
		ss.put(l)
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, err
		}
		// The lease expired (an outage longer than its TTL): grant another.
	}
	return nil, errors.New("lease expired twice in a row")
}

// lookup returns the lease for secs, referenced, granting it when there is
// none. Concurrent callers share one grant.
func (ss *session) lookup(ctx context.Context, secs int64) (*lease, error) {
	ss.mu.Lock()
	if ss.isDone {
		ss.mu.Unlock()
		return nil, ErrClosed
	}
	l := ss.leases[secs]
	creator := l == nil
	if creator {
		l = &lease{secs: secs, ready: make(chan struct{})}
		ss.leases[secs] = l
	}
	l.refs++
	ss.mu.Unlock()
	if creator {
		ss.grant(ctx, l)
	}
	select {
	case <-l.ready:
	case <-ctx.Done():
		ss.put(l)
		return nil, context.Cause(ctx)
	}
	if l.err != nil {
		ss.put(l)
		return nil, l.err
	}
	return l, nil
}

func (ss *session) grant(ctx context.Context, l *lease) {
	sent := time.Now()
	g, err := ss.s.cli.Grant(ctx, l.secs+leaseSlack)
	ss.mu.Lock()
	closing := ss.isDone && err == nil
	switch {
	case err != nil:
		l.err = ss.s.wrap(ctx, "grant lease", "", err)
		ss.markDead(l)
	case closing:
		l.err = ErrClosed // Close ran while we granted: we revoke it below
	default:
		l.id = g.ID
		l.until = sent.Add(time.Duration(g.TTL) * time.Second)
		l.last = sent
	}
	close(l.ready) // under mu: close sees a lease either ready or not
	ss.mu.Unlock()
	if closing {
		rctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		_, _ = ss.s.cli.Revoke(rctx, g.ID)
		cancel()
	}
}

// cover makes sure l lives at least need from now, with one keep-alive
// (shared by concurrent callers) if the background ones fell behind.
func (ss *session) cover(ctx context.Context, l *lease, need time.Duration) error {
	for range 2 {
		ss.mu.Lock()
		ok := !l.dead && time.Until(l.until) > need
		inflight := l.ka
		ss.mu.Unlock()
		switch {
		case ok:
			return nil
		case inflight == nil:
			return ss.keepAlive(ctx, l)
		}
		select {
		case <-inflight:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return ss.keepAlive(ctx, l)
}

// keepAlive sends one keep-alive for l and records its new expiry bound.
func (ss *session) keepAlive(ctx context.Context, l *lease) error {
	done := make(chan struct{})
	ss.mu.Lock()
	if l.ka == nil {
		l.ka = done
	}
	ss.mu.Unlock()
	sent := time.Now()
	ka, err := ss.s.cli.KeepAliveOnce(ctx, l.id)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if l.ka == done {
		l.ka = nil
		close(done)
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		ss.markDead(l)
		return err
	case err != nil:
		return ss.s.wrap(ctx, "keep lease alive", "", err)
	}
	if u := sent.Add(time.Duration(ka.TTL) * time.Second); u.After(l.until) {
		l.until = u
	}
	l.last = sent
	return nil
}

// markDead forgets an expired lease; ss.mu is held.
func (ss *session) markDead(l *lease) {
	l.dead = true
	if ss.leases[l.secs] == l {
		delete(ss.leases, l.secs)
	}
}

// put drops a reference taken by get.
func (ss *session) put(l *lease) {
	ss.mu.Lock()
	ss.unref(l)
	ss.mu.Unlock()
}

func (ss *session) unref(l *lease) {
	l.refs--
	if l.refs == 0 {
		l.idle = time.Now()
	}
}

// track records (or refreshes) a lock or queue entry on l, taking over the
// caller's reference to l. It returns the entry.
func (ss *session) track(m map[ref]*tracked, r ref, l *lease, ttl time.Duration) *tracked {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := m[r]
	if t == nil {
		t = &tracked{lease: l}
		m[r] = t
	} else {
		ss.unref(t.lease) // the entry's old reference; keep the new one
		t.lease = l
	}
	t.deadline = time.Now().Add(ttl)
	t.gen++
	t.mod, t.next = 0, nil // a later write: setHead again
	return t
}

// untrack forgets a lock or queue entry.
func (ss *session) untrack(m map[ref]*tracked, r ref) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if t := m[r]; t != nil {
		delete(m, r)
		ss.unref(t.lease)
	}
}

// run is the session's goroutine: keep-alives, sweeps of abandoned locks and
// waiters, revokes of idle leases. It runs until close.
func (ss *session) run() {
	defer close(ss.donec)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ss.stopc:
			return
		case <-t.C:
			// Not the tick's time: a round that outlasts a tick (requests
			// timing out in an outage) would leave the next one a tick
			// behind, and sweeps late by a round.
			ss.round(time.Now())
		}
	}
}

// round does one tick of work, concurrently, and waits for it.
func (ss *session) round(now time.Time) {
	ctx, cancel := context.WithTimeout(ss.ctx, max(ss.s.timeout, keepAliveEvery))
	defer cancel()
	var wg sync.WaitGroup
	due, idle, locks, entries := ss.collect(now)
	for _, l := range due {
		wg.Go(func() { _ = ss.keepAlive(ctx, l) })
	}
	for _, l := range idle {
		wg.Go(func() { _, _ = ss.s.cli.Revoke(ctx, l.id) })
	}
	for _, sw := range locks {
		wg.Go(func() { ss.sweepLock(ctx, sw) })
	}
	for _, sw := range entries {
		wg.Go(func() { ss.sweepEntry(ctx, sw) })
	}
	for _, r := range ss.s.sems.expiredPermits(now) { // see permitTracks
		wg.Go(func() { ss.s.sweepPermit(ctx, r) })
	}
	wg.Wait()
}

// sweep is a lock or queue entry past its deadline.
type sweep struct {
	ref
	t *tracked
}

// collect picks, under the lock, the leases due for a keep-alive, the idle
// leases to revoke (forgotten at once) and the expired locks and entries
// (forgotten at once: a sweep wins over a renewal that starts later).
func (ss *session) collect(now time.Time) (due, idle []*lease, locks, entries []sweep) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for secs, l := range ss.leases {
		select {
		case <-l.ready:
		default:
			continue // being granted
		}
		switch {
		case l.refs == 0 && now.Sub(l.idle) > idleRevoke:
			delete(ss.leases, secs)
			l.dead = true
			idle = append(idle, l)
		case now.Sub(l.last) >= keepAliveEvery && l.ka == nil:
			due = append(due, l)
		}
	}
	expired := func(m map[ref]*tracked) []sweep {
		var out []sweep
		for r, t := range m {
			if now.After(t.deadline) {
				delete(m, r)
				ss.unref(t.lease)
				out = append(out, sweep{r, t})
			}
		}
		return out
	}
	locks = append(expired(ss.held), retries(ss.retryLocks, ss.held)...)
	for _, sw := range locks {
		ss.swept[sw.ref] = true
	}
	return due, idle, locks, append(expired(ss.waiting), retries(ss.retryEntries, ss.waiting)...)
}

// retries takes the failed sweeps of retry to run again, dropping those
// whose lease is gone (etcd deleted what was on it) and those whose token
// the store tracks again in m (a retried Acquire or Renew took it back);
// ss.mu is held.
func retries(retry, m map[ref]*tracked) []sweep {
	var out []sweep
	for r, t := range retry {
		delete(retry, r)
		if t.lease.dead || m[r] != nil {
			continue
		}
		out = append(out, sweep{r, t})
	}
	return out
}

// failedSweep records a sweep etcd did not answer, to try it again next
// tick.
func (ss *session) failedSweep(retry map[ref]*tracked, sw sweep) {
	if !ss.isDone {
		retry[sw.ref] = sw.t
	}
}

// sweepLock deletes an abandoned lock if it still holds its token.
func (ss *session) sweepLock(ctx context.Context, sw sweep) {
	k := ss.s.lockKey(sw.key)
	_, err := ss.s.cli.Txn(ctx).If(mine(k, sw.token)...).Then(clientv3.OpDelete(k)).Commit()
	ss.mu.Lock()
	delete(ss.swept, sw.ref)
	if err != nil {
		ss.failedSweep(ss.retryLocks, sw)
	}
	ss.mu.Unlock()
}

// sweepEntry deletes an abandoned queue entry, and the lock if a release
// granted it to the entry's token (nobody took the grant: Granted or an
// Acquire would have tracked the lock).
func (ss *session) sweepEntry(ctx context.Context, sw sweep) {
	k, e := ss.s.lockKey(sw.key), ss.s.entryKey(sw.key, sw.token)
	ss.mu.Lock()
	held := ss.held[sw.ref] != nil // taken meanwhile: the lock is not a stale grant
	ss.mu.Unlock()
	var err error
	if held {
		_, err = ss.s.cli.Delete(ctx, e)
	} else {
		_, err = ss.s.cli.Txn(ctx).If(mine(k, sw.token)...).
			Then(clientv3.OpDelete(k), clientv3.OpDelete(e)).
			Else(clientv3.OpDelete(e)).Commit()
	}
	if err != nil {
		ss.mu.Lock()
		ss.failedSweep(ss.retryEntries, sw)
		ss.mu.Unlock()
	}
}

// close stops the goroutine and revokes every lease.
func (ss *session) close() {
	ss.cancel()
	close(ss.stopc)
	<-ss.donec
	ss.mu.Lock()
	ss.isDone = true
	var ls []*lease
	for _, l := range ss.leases {
		select {
		case <-l.ready:
			if l.err == nil {
				ls = append(ls, l)
			}
		default: // being granted: grant revokes it when it sees isDone
		}
		l.dead = true
	}
	ss.leases = map[int64]*lease{}
	ss.held = map[ref]*tracked{}
	ss.waiting = map[ref]*tracked{}
	ss.retryLocks = map[ref]*tracked{}
	ss.retryEntries = map[ref]*tracked{}
	ss.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() { _, _ = ss.s.cli.Revoke(ctx, l.id) })
	}
	wg.Wait()
}

// lookupHeld returns the tracked lock r (nil if none), to be passed to
// renewed after the renewal's read.
func (ss *session) lookupHeld(r ref) *tracked {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.held[r]
}

// renewed records a successful renewal read of r on l: the lock's deadline
// moves to ttl from now. It returns false, dropping the reference to l, when
// the session swept r since t was looked up: the sweep's delete may apply
// after the read, so the renewal cannot be trusted.
func (ss *session) renewed(m map[ref]*tracked, r ref, t *tracked, l *lease, ttl time.Duration) bool {
	ss.mu.Lock()
	cur := m[r]
	if ss.swept[r] || (t != nil && cur != t) {
		ss.unref(l)
		ss.mu.Unlock()
		return false
	}
	ss.mu.Unlock()
	ss.track(m, r, l, ttl)
	return true
}

// standing is what a store knows of a token's hold on a key, for its
// next acquire.
type standing struct {
	// mayOwn: the token holds or may hold the lock (an acquire whose
	// answer was lost, a sweep in flight or to be tried again), or waits
	// in the queue, where a release may grant it the lock.
	mayOwn bool
	// mayQueue: see session.mayQueue.
	mayQueue bool
	// rev is the create revision of the token's queue entry as this
	// store last saw it, 0 if unknown.
	rev int64
}

// standingOf returns what the store knows of r, under one lock.
func (ss *session) standingOf(r ref) standing {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st := standing{mayQueue: ss.waiting[r] != nil || ss.retryEntries[r] != nil}
	st.mayOwn = st.mayQueue || ss.held[r] != nil || ss.retryLocks[r] != nil || ss.swept[r]
	if t := ss.waiting[r]; t != nil {
		st.rev = t.rev
	}
	return st
}

// mayQueue reports whether r may have a queue entry that this store wrote:
// tracked as waiting, or its failed sweep is to be retried. An acquire or
// release of an r that never queued here needs no delete of the entry.
func (ss *session) mayQueue(r ref) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.waiting[r] != nil || ss.retryEntries[r] != nil
}

// setQueue records what a waiter's acquire (sent at sent, answered at seen)
// saw, for its WaitRelease and for the takeover of an expired lock. It
// returns how long the lock has left by the waiter's clock (see
// takeoverAt), counted from sent as Grant.Remaining is, -1 when the lock
// is free or that is unknown. Counted from seen, a Locker that retries at
// its own send time + Remaining would come back one request latency before
// the takeover is allowed, and spend a raft write on learning so. It is
// takeoverEarly short, so that a late timer still brings the head back
// before the takeover, which takeOver then waits for.
func (ss *session) setQueue(t *tracked, v keyView, sent, seen time.Time, reqTTL time.Duration) time.Duration {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t.reqTTL = reqTTL
	var mod int64
	var ttl time.Duration
	if v.held && v.myRev > 0 {
		_, ttl, _, _, _ = lockFields(v.lock.Value)
		if ttl > 0 {
			mod = v.lock.ModRevision
		}
	}
	if mod != t.lockMod || v.myRev != t.rev {
		// A new lock write, or our entry was re-created: the clock
		// starts again from this answer.
		t.lockMod, t.lockSeen, t.lockTTL = mod, seen, ttl
	}
	t.rev = v.myRev
	t.snap = snapOf(v)
	if mod == 0 {
		return -1
	}
	return max(t.lockSeen.Add(t.lockTTL).Sub(sent)-takeoverEarly, 0)
}

// sighting is a lock write a waiter's key watch saw: the lock at mod
// revision mod (TTL ttl) arrived at at, while the waiter's queue entry
// existed with create revision entry < mod.
type sighting struct {
	r     ref
	entry int64
	mod   int64
	at    time.Time
	ttl   time.Duration
}

// sawLock records what a key watch saw for the waiter of each sighting, as
// an acquire answer would have shown it: the watch event came after the
// write, and the waiter's entry was older than the write, so the holder's
// renewals from then on write the lock (see takeoverAt). Only a newer mod
// revision, with the entry the store tracks, counts.
func (ss *session) sawLock(sights []sighting) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, sg := range sights {
		t := ss.waiting[sg.r]
		if t == nil || t.rev != sg.entry || sg.mod <= t.lockMod || sg.ttl <= 0 {
			continue
		}
		t.lockMod, t.lockSeen, t.lockTTL = sg.mod, sg.at, sg.ttl
	}
}

// takeoverAt returns the lock r waits for (its mod revision and r's entry)
// and when r may take it over: when r's acquires have seen it unchanged
// (one mod revision) for its whole TTL, measured on this store's clock from
// the first answer that showed it, while r's queue entry stayed at entry
// (the same create revision: it was never deleted in between). A holder
// renews with a write whenever its renewal read shows a queue entry (see
// finishRenew), so every renewal after r's entry was created moved the mod
// revision, and the holder's own expiry guard ran out by then (both clocks
// running at the same rate, within the holder's drift margin). ok is false
// when the lock is not known.
func (ss *session) takeoverAt(r ref) (mod, entry int64, at time.Time, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.waiting[r]
	if t == nil || t.lockMod == 0 || t.rev == 0 {
		return 0, 0, time.Time{}, false
	}
	return t.lockMod, t.rev, t.lockSeen.Add(t.lockTTL), true
}

// waitingEntry returns the create revision and lease of waiter r's queue
// entry as this store wrote or saw it, when its deadline is more than two
// ticks away (no sweep of it can be due or in flight); rev is 0 otherwise.
// left is how long the lock r waits for has left by r's clock, counted as
// setQueue counts Grant.Remaining (-1: unknown).
func (ss *session) waitingEntry(r ref) (rev int64, l *lease, left time.Duration) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.waiting[r]
	if t == nil || time.Until(t.deadline) <= 2*tick {
		return 0, nil, -1
	}
	left = -1
	if t.lockMod > 0 {
		left = max(time.Until(t.lockSeen.Add(t.lockTTL))-takeoverEarly, 0)
	}
	return t.rev, t.lease, left
}

// snapshot returns what r's last acquire saw, nil if unknown.
func (ss *session) snapshot(r ref) *queueSnap {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if t := ss.waiting[r]; t != nil && t.snap != nil {
		cp := *t.snap
		cp.queue = maps.Clone(t.snap.queue)
		cp.entries = maps.Clone(t.snap.entries)
		return &cp
	}
	return nil
}
