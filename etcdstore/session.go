package etcdstore

import (
	"context"
	"maps"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// session holds what the store knows of the tokens it acquired and queued:
// hints, never clean-up (etcd expires what nobody renews). A missing hint
// costs a request or a slower takeover, never a lock.
type session struct {
	ctx    context.Context // ends at Close: the key watches
	cancel context.CancelFunc
	leases leases

	mu      sync.Mutex
	held    map[ref]*tracked // locks
	waiting map[ref]*tracked // queue entries
	grants  map[ref]*tracked // locks a release granted to a waiter here, seen by its watch
	adds    int              // tracks since the last prune
}

// ref names one lock or queue entry: a key and a token.
type ref struct{ key, token string }

// tracked is what the store knows of a lock or queue entry it wrote.
type tracked struct {
	deadline time.Time // its TTL (or queue TTL) after the last write
	rev      int64     // queue entries: the entry's create revision (0: unknown)
	snap     *keyView  // what the last acquire of a queue entry saw, for WaitRelease
	// Queue entries: the lock they wait for (mod revision, 0: free or
	// unknown), when this store first saw it there, and its TTL (takeoverAt);
	// the TTL the waiter asked for (a grant's Handoff.TTL).
	lockMod  int64
	lockSeen time.Time
	lockTTL  time.Duration
	reqTTL   time.Duration
	// Locks: the mod revision the acquire wrote (0: unknown) and the queue
	// head it saw (nil: none), for the grant in Release; a grant's fence.
	mod   int64
	next  *headEntry
	fence int64
	// Grants: the lock is on this store's presence, as the grant wrote it
	// (not rewritten since, as far as this store knows): sweepGrants.
	kept bool
}

// headEntry is the head of a key's queue as a read showed it, for a grant.
type headEntry struct {
	key    string // the entry's etcd key
	token  string
	rev    int64 // its create revision
	lease  clientv3.LeaseID
	holder string
	ttl    time.Duration // the TTL to grant (entryFields)
}

func newSession(s *Store) *session {
	ctx, cancel := context.WithCancel(context.Background())
	return &session{
		ctx: ctx, cancel: cancel,
		leases:  leases{s: s, cur: map[int64]*epoch{}},
		held:    map[ref]*tracked{},
		waiting: map[ref]*tracked{},
		grants:  map[ref]*tracked{},
	}
}

func (ss *session) closed() bool { return ss.ctx.Err() != nil }

// track records (or refreshes) a lock or queue entry written until ttl from now.
func (ss *session) track(m map[ref]*tracked, r ref, ttl time.Duration) *tracked {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := m[r]
	if t == nil {
		t = &tracked{}
		m[r] = t
		ss.prune()
	}
	t.deadline = time.Now().Add(ttl)
	t.mod, t.next = 0, nil // a later write: unknown until took
	return t
}

// prune drops, every 1024 new tracks, those past their deadline by a
// minute; ss.mu is held.
func (ss *session) prune() {
	if ss.adds++; ss.adds < 1024 {
		return
	}
	ss.adds = 0
	old := time.Now().Add(-time.Minute)
	for _, m := range []map[ref]*tracked{ss.held, ss.waiting, ss.grants} {
		maps.DeleteFunc(m, func(_ ref, t *tracked) bool { return t.deadline.Before(old) })
	}
}

// forget forgets r's lock, queue entry and grant (a release).
func (ss *session) forget(r ref) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.held, r)
	delete(ss.waiting, r)
	delete(ss.grants, r)
}

// granted records that a release granted waiter r the lock for ttl, at mod
// revision mod with fence, next the queue head after it (for r's release),
// and returns the TTL r asked for; false when r is not waiting here. The
// waiter's queue entry stays tracked: its Locker may not take the grant
// (it acquires again, or leaves with Release, which deletes the entry).
// kept: the lock is on this store's presence.
func (ss *session) granted(r ref, ttl time.Duration, mod, fence int64, next *headEntry, kept bool) (time.Duration, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	w := ss.waiting[r]
	if w == nil {
		return 0, false
	}
	ss.grants[r] = &tracked{deadline: time.Now().Add(ttl), mod: mod, next: next, fence: fence, kept: kept}
	return w.reqTTL, true
}

// staleGrants returns the grants still on this store's presence, neither
// renewed (moved) nor released, past their deadline: no Locker trusts them
// any longer (a hand-off is trusted for at most its TTL from a write the
// grant came after). Each is returned once.
func (ss *session) staleGrants() map[ref]int64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var stale map[ref]int64
	now := time.Now()
	for r, g := range ss.grants {
		if g.kept && g.mod > 0 && now.After(g.deadline) {
			if stale == nil {
				stale = map[ref]int64{}
			}
			stale[r], g.kept = g.mod, false
		}
	}
	return stale
}

// unswept records that the sweep of grant r at mod failed: the next
// staleGrants returns it again, unless it was moved or forgotten since.
func (ss *session) unswept(r ref, mod int64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if g := ss.grants[r]; g != nil && g.mod == mod {
		g.kept = true
	}
}

// took records that r holds its lock until ttl from now, written at mod
// revision mod with next the queue head after it (0, nil: unknown), and no
// longer waits: a grant it saw is taken or gone.
func (ss *session) took(r ref, ttl time.Duration, mod int64, next *headEntry) {
	t := ss.track(ss.held, r, ttl)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t.mod, t.next = mod, next
	delete(ss.waiting, r)
	delete(ss.grants, r)
}

// moved records that r's holder rewrote its lock at revision mod (0: unknown).
func (ss *session) moved(r ref, mod int64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, t := range []*tracked{ss.held[r], ss.grants[r]} {
		if t != nil && t.mod != 0 {
			t.mod = mod
		}
		if t != nil {
			t.kept = false // rewritten: on the holder's own lease
		}
	}
}

// headOf returns what took or granted recorded for lock r (0, nil if nothing).
func (ss *session) headOf(r ref) (int64, *headEntry) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, t := range []*tracked{ss.held[r], ss.grants[r]} { // a lock of ours first
		if t != nil {
			return t.mod, t.next
		}
	}
	return 0, nil
}

// standing is what a store knows of a token on a key, for its next acquire.
type standing struct {
	mayOwn   bool  // it holds, may hold (a lost reply) or waits (may be granted)
	mayQueue bool  // it may have a queue entry this store wrote
	rev      int64 // its queue entry's create revision, 0 if unknown
	// A grant to it this store saw: the lock's mod revision (0: none) and fence.
	grantMod, fence int64
}

// standingOf returns what the store knows of r, under one lock.
func (ss *session) standingOf(r ref) standing {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st := standing{mayQueue: ss.waiting[r] != nil}
	st.mayOwn = st.mayQueue || ss.held[r] != nil
	if t := ss.waiting[r]; t != nil {
		st.rev = t.rev
	}
	if g := ss.grants[r]; g != nil && g.fence > 0 {
		st.mayOwn, st.grantMod, st.fence = true, g.mod, g.fence
	}
	return st
}

// setQueue records what a waiter's acquire (sent at sent, answered at seen)
// saw, for WaitRelease and takeoverAt. It returns the time until the
// takeover, counted from sent as Grant.Remaining is, less takeoverEarly; -1
// when the lock is free or unknown.
func (ss *session) setQueue(t *tracked, v keyView, sent, seen time.Time, reqTTL time.Duration) time.Duration {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t.reqTTL = reqTTL
	var mod int64 // the lock's, if it has a TTL and we wait
	_, ttl, _, _, _ := lockFields(v.lock.GetValue())
	if v.myRev > 0 && ttl > 0 {
		mod = v.lock.ModRevision
	}
	if mod != t.lockMod || v.myRev != t.rev { // the clock starts again
		t.lockMod, t.lockSeen, t.lockTTL = mod, seen, ttl
	}
	t.rev = v.myRev
	t.snap = &v
	if mod == 0 {
		return -1
	}
	return max(t.lockSeen.Add(t.lockTTL).Sub(sent)-takeoverEarly, 0)
}

// sawLock records, as an acquire answer would, that r's key watch saw the
// lock written at revision mod (with ttl) at 'at' while r's entry had create
// revision entry: only a newer mod revision, with the entry tracked, counts.
func (ss *session) sawLock(r ref, entry, mod int64, at time.Time, ttl time.Duration) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if t := ss.waiting[r]; t != nil && t.rev == entry && mod > t.lockMod && ttl > 0 {
		t.lockMod, t.lockSeen, t.lockTTL = mod, at, ttl
	}
}

// takeoverAt returns the lock r waits for (its mod revision and r's entry)
// and when r may take it over: once this store has seen it at one mod
// revision for its whole TTL, r's entry unchanged. Every renewal writes the
// lock, so by then the holder's own expiry guard has run out (docs/etcd.md).
// ok is false when the lock is not known.
func (ss *session) takeoverAt(r ref) (mod, entry int64, at time.Time, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.waiting[r]
	if t == nil || t.lockMod == 0 || t.rev == 0 {
		return 0, 0, time.Time{}, false
	}
	return t.lockMod, t.rev, t.lockSeen.Add(t.lockTTL), true
}

// snapshot returns what r's last acquire saw, nil if unknown.
func (ss *session) snapshot(r ref) *keyView {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if t := ss.waiting[r]; t != nil && t.snap != nil {
		cp := *t.snap
		cp.entries = maps.Clone(t.snap.entries)
		return &cp
	}
	return nil
}
