package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Store's presence (driver.PresenceKeeper) is one etcd lease, of the
// longest TTL asked for, that KeepPresence keeps alive. A place queued or
// refreshed with Kept is put on it instead of on the class's rotating
// lease, so it needs no write while it waits, and etcd deletes the places
// of a process that stops keeping its presence when the lease runs out
// (docs/etcd.md).

// KeepPresence implements driver.PresenceKeeper: the first call grants the
// lease, and one for a longer ttl a longer one; later ones keep it alive,
// and those it replaced (one LeaseKeepAlive each, which etcd's leader
// answers without a raft write). When etcd no longer knows the lease (the
// process lost etcd, or paused, for longer than ttl), the places on it are
// gone with it: it returns the error, so that the caller refreshes every
// kept place (and queues it again), and the next call grants a new one.
func (s *Store) KeepPresence(ctx context.Context, ttl time.Duration) error {
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	sent := time.Now()
	id, fresh, err := s.sess.leases.presence(ctx, ttl)
	if err == nil && !fresh {
		var r *clientv3.LeaseKeepAliveResponse
		switch r, err = s.cli.KeepAliveOnce(ctx, id); {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.sess.leases.gone(id) // the next call grants a new one
		case err == nil:
			s.sess.leases.keptAlive(id, sent.Add(time.Duration(r.TTL)*time.Second))
		}
	}
	for _, id := range s.sess.leases.replaced() { // places may still be on them
		switch r, kerr := s.cli.KeepAliveOnce(ctx, id); {
		case errors.Is(kerr, rpctypes.ErrLeaseNotFound):
			s.sess.leases.gone(id)
			err = cmp.Or(err, kerr)
		case kerr != nil:
			err = cmp.Or(err, kerr)
		default:
			s.sess.leases.keptAlive(id, sent.Add(time.Duration(r.TTL)*time.Second))
		}
	}
	if err != nil {
		return s.wrap(ctx, "keep presence", "", err)
	}
	s.sweepGrants(ctx)
	return nil
}

// sweepGrants deletes the locks handed to this store's waiters on its
// presence that their holders neither renewed nor released by the grant's
// TTL (a release lost while the lease ended, say): the presence would keep
// them for as long as the store keeps it. Each delete is guarded by the
// grant's mod revision, so a lock rewritten since (renewed, released and
// taken again) is left alone. One that fails is tried again next round.
func (s *Store) sweepGrants(ctx context.Context) {
	for r, mod := range s.sess.staleGrants() {
		k := s.lockKey(r.key)
		if _, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", mod)).Then(clientv3.OpDelete(k)).Commit(); err != nil {
			s.sess.unswept(r, mod) // the next round tries again
		}
	}
}

// readPerTxn and movePerTxn are how many places one RefreshQueue
// transaction reads or moves: etcd's --max-txn-ops (128) bounds a
// transaction's compares, and its ops plus those of the transactions nested
// in it on any one path (a move: two more levels).
const (
	readPerTxn = maxTxnOps
	movePerTxn = 100
)

// RefreshQueue implements driver.QueueRefresher. Places the presence keeps
// (Kept) are only read: one transaction per readPerTxn places that, if
// every entry is on the presence (one compare each), counts each lock, else
// a second that reads the entries. With compares and reads alone, etcd
// answers them without a raft write. The others, and the places a read found not on the
// presence yet, are moved: one transaction per movePerTxn places, each a
// nested transaction that, while the token's entry is there, puts it on its
// lease (the presence with Kept, else the current lease of QueueTTL) unless
// the presence keeps it already, and counts the lock.
func (s *Store) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	errs := make([]error, len(reqs))
	var read, move []int
	for i, r := range reqs {
		switch errs[i] = checkRequest(r.Key, r.Token, "", r.QueueTTL); {
		case errs[i] != nil:
		case r.Kept > 0:
			read = append(read, i)
		default:
			move = append(move, i)
		}
	}
	for c := range slices.Chunk(read, readPerTxn) {
		move = append(move, s.readPlaces(ctx, reqs, c, errs, true)...)
	}
	for c := range slices.Chunk(move, movePerTxn) {
		s.movePlaces(ctx, reqs, c, errs)
	}
	return errs
}

// readPlaces refreshes the kept places reqs[i], i in idx, with one read,
// setting errs[i], and returns those whose entry is not on the presence.
// When an entry failed its compare (gone, or not on the presence), a second
// read of the entries tells: a gone one is not queued, and the others on the
// presence are read again (again: once).
func (s *Store) readPlaces(parent context.Context, reqs []driver.QueueRefresh, idx []int, errs []error, again bool) (move []int) {
	fail := func(err error) []int {
		setAll(errs, idx, err)
		return nil
	}
	ctx, end, err := s.begin(parent)
	if err != nil {
		return fail(err)
	}
	defer end()
	first, ttl := reqs[idx[0]], time.Duration(0)
	for _, i := range idx {
		ttl = max(ttl, reqs[i].QueueTTL)
	}
	p, _, err := s.sess.leases.presence(ctx, ttl)
	if err != nil {
		return fail(s.wrap(ctx, "refresh queue", first.Key, err))
	}
	cmps := make([]clientv3.Cmp, len(idx))
	locks := make([]clientv3.Op, len(idx))
	for j, i := range idx {
		cmps[j] = clientv3.Compare(clientv3.LeaseValue(s.entryKey(reqs[i].Key, reqs[i].Token)), "=", p)
		locks[j] = clientv3.OpGet(s.lockKey(reqs[i].Key), clientv3.WithCountOnly())
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(locks...).Commit()
	if err != nil {
		return fail(s.wrap(ctx, "refresh queue", first.Key, err))
	}
	if !resp.Succeeded { // rare: the entries' read is not on every request
		entries := make([]clientv3.Op, len(idx))
		for j, i := range idx {
			entries[j] = clientv3.OpGet(s.entryKey(reqs[i].Key, reqs[i].Token)) // keys-only would drop the lease
		}
		get, err := s.cli.Txn(ctx).Then(entries...).Commit()
		if err != nil {
			return fail(s.wrap(ctx, "refresh queue", first.Key, err))
		}
		var on []int // entries on the presence
		for j, i := range idx {
			switch kvs := get.Responses[j].GetResponseRange().GetKvs(); {
			case len(kvs) == 0:
				errs[i] = driver.ErrNotQueued
			case clientv3.LeaseID(kvs[0].Lease) != p || !again:
				move = append(move, i)
			default:
				on = append(on, i)
			}
		}
		if len(on) == 0 {
			return move
		}
		return append(move, s.readPlaces(parent, reqs, on, errs, false)...)
	}
	for j, i := range idx {
		if resp.Responses[j].GetResponseRange().GetCount() == 0 {
			errs[i] = leasehold.ErrNotHeld
		} else {
			s.refreshed(reqs[i])
		}
	}
	return nil
}

// movePlaces refreshes the places reqs[i], i in idx, in one transaction
// that puts each entry on its lease, setting errs[i].
func (s *Store) movePlaces(parent context.Context, reqs []driver.QueueRefresh, idx []int, errs []error) {
	fail := func(err error) { setAll(errs, idx, err) }
	ctx, end, err := s.begin(parent)
	if err != nil {
		fail(err)
		return
	}
	defer end()
	type class struct {
		ttl  time.Duration
		kept bool
	}
	leases := map[class]clientv3.LeaseID{}
	ops := make([]clientv3.Op, len(idx))
	for j, i := range idx {
		r := reqs[i]
		c := class{r.QueueTTL, r.Kept > 0}
		l, ok := leases[c]
		if !ok {
			if c.kept {
				l, _, err = s.sess.leases.presence(ctx, r.QueueTTL)
			} else {
				l, err = s.sess.leases.get(ctx, r.QueueTTL)
			}
			if err != nil {
				fail(s.wrap(ctx, "refresh queue", r.Key, err))
				return
			}
			leases[c] = l
		}
		e := s.entryKey(r.Key, r.Token)
		ops[j] = clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e), ">", 0)},
			[]clientv3.Op{s.keepEntry(e, clientv3.OpPut(e, "", clientv3.WithIgnoreValue(), clientv3.WithLease(l))), clientv3.OpGet(s.lockKey(r.Key), clientv3.WithCountOnly())},
			nil)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		fail(s.wrapLease(ctx, "refresh queue", reqs[idx[0]].Key, err, slices.Collect(maps.Values(leases))...))
		return
	}
	for j, i := range idx {
		inner := resp.Responses[j].GetResponseTxn()
		switch {
		case !inner.GetSucceeded():
			errs[i] = driver.ErrNotQueued
		case inner.GetResponses()[1].GetResponseRange().GetCount() == 0:
			errs[i] = leasehold.ErrNotHeld
		default:
			s.refreshed(reqs[i])
		}
	}
}

// setAll sets errs[i] to err for every i in idx.
func setAll(errs []error, idx []int, err error) {
	for _, i := range idx {
		errs[i] = err
	}
}

// refreshed records a refresh of r's place that kept it.
func (s *Store) refreshed(r driver.QueueRefresh) {
	s.sess.track(s.sess.waiting, ref{r.Key, r.Token}, max(r.QueueTTL, r.Kept))
}

// keepEntry returns put, a write of queue entry e (on the presence or a
// rotating lease), guarded so that it leaves an entry on the presence of
// queueTTL's class where it is: a place once kept stays kept, whatever
// write without Kept (one sent before the presence was first kept) comes
// after, and a kept place is not written again.
func (s *Store) keepEntry(e string, put clientv3.Op) clientv3.Op {
	p := s.sess.leases.presenceOf()
	if p == 0 {
		return put
	}
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(e), "=", p)}, nil, []clientv3.Op{put})
}

// presence returns the Store's presence lease and whether this call
// granted it (fresh). It grants one of ttl's class when there is none or
// the presence's class is shorter (a place written with Kept must last its
// QueueTTL from its Locker's last keeping): one presence serves every TTL,
// and lasts the longest asked for. The one it replaces is still kept alive
// with it (replaced): the places of shorter classes stay on it until a
// refresh moves them, and a place next in line is refreshed only every
// Kept/3.
func (ls *leases) presence(ctx context.Context, ttl time.Duration) (id clientv3.LeaseID, fresh bool, err error) {
	secs, err := ttlSeconds(ttl)
	if err != nil {
		return 0, false, err
	}
	for {
		ls.mu.Lock()
		if ls.closed {
			ls.mu.Unlock()
			return 0, false, ErrClosed
		}
		prev := ls.pres
		e := prev
		granter := e == nil || ready(e) && e.secs < secs
		if granter {
			if prev != nil { // granted: an error dropped it
				ls.park(prev)
			}
			e = &epoch{ready: make(chan struct{}), secs: secs}
			ls.pres = e
		}
		ls.mu.Unlock()
		if granter {
			ls.grant(ctx, e, secs, func() {
				if ls.pres == e {
					ls.pres = nil
					if i := slices.Index(ls.old, prev); i >= 0 { // the one it replaced goes on
						ls.pres, ls.old = prev, slices.Delete(ls.old, i, i+1)
					}
				}
			})
		}
		select {
		case <-e.ready:
		case <-ctx.Done():
			return 0, false, context.Cause(ctx)
		}
		switch {
		case e.err != nil && !granter && ctx.Err() == nil && (errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.DeadlineExceeded)):
			continue // the context of the caller that granted ended, not ours
		case e.err != nil:
			return 0, false, e.err
		case e.secs < secs:
			continue // granted meanwhile, shorter
		}
		return e.id, granter, nil
	}
}

// ready reports whether e's grant was answered.
func ready(e *epoch) bool {
	select {
	case <-e.ready:
		return true
	default:
		return false
	}
}

// isPresence reports whether id is the Store's presence or one it replaced.
func (ls *leases) isPresence(id clientv3.LeaseID) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if e := ls.pres; e != nil && ready(e) && e.id == id && id != 0 {
		return true
	}
	return slices.ContainsFunc(ls.old, func(e *epoch) bool { return e.id == id && id != 0 })
}

// presenceOf returns the Store's presence lease, 0 when it has none (or it
// is being granted).
func (ls *leases) presenceOf() clientv3.LeaseID {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if e := ls.pres; e != nil && ready(e) {
		return e.id // 0 after an error
	}
	return 0
}

// replaced returns the presences that a longer one replaced, or that a
// request wrote on beside a lease etcd did not know (expired).
func (ls *leases) replaced() []clientv3.LeaseID {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ids := make([]clientv3.LeaseID, len(ls.old))
	for i, e := range ls.old {
		ids[i] = e.id
	}
	return ids
}

// gone forgets presence id, which etcd no longer knows.
func (ls *leases) gone(id clientv3.LeaseID) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.pres != nil && ls.pres.id == id {
		ls.pres = nil
	}
	ls.old = slices.DeleteFunc(ls.old, func(e *epoch) bool { return e.id == id })
}

// keptAlive records that presence id lives at least until 'until', so that
// Close still revokes it.
func (ls *leases) keptAlive(id clientv3.LeaseID, until time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	all := append([]*epoch{ls.pres}, ls.old...)
	i := slices.IndexFunc(all, func(o *epoch) bool { return o != nil && o.id == id })
	if i < 0 || !until.After(all[i].until) {
		return
	}
	e := all[i]
	e.until = until
	if !slices.Contains(ls.live, e) { // dropped as expired: it was not
		ls.live = append(ls.live, e)
	}
}
