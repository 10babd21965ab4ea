package etcdstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// leaseSlack is added to a TTL's whole seconds when a lease is granted:
	// it serves new writes while it lives a full TTL, about this long.
	leaseSlack = 1 // seconds
	// closeTimeout bounds the revokes of Close.
	closeTimeout = 2 * time.Second
)

// leases are the store's etcd leases, never kept alive: every write puts
// its key on the current lease of its TTL class (whole seconds), so etcd
// deletes what its owner stops writing (docs/etcd.md, "Expiry is etcd's").
// A class's lease is current while it has more than the write's TTL left;
// concurrent writers share the next grant.
type leases struct {
	s      *Store
	mu     sync.Mutex
	cur    map[int64]*epoch // by granted seconds
	pres   *epoch           // the presence (presence.go): kept alive, not rotated; nil: none
	old    []*epoch         // presences a longer one replaced: still kept alive
	live   []*epoch         // granted and maybe not expired: Close revokes them
	closed bool
}

// epoch is one granted lease.
type epoch struct {
	ready chan struct{} // closed when the grant is answered
	secs  int64         // its TTL class
	// Set before ready is closed:
	id    clientv3.LeaseID
	until time.Time // lower bound of etcd's expiry: grant sent + its TTL
	err   error
}

// get returns a lease that lives at least ttl from now, granting one when
// the current lease of ttl's class has less left.
func (ls *leases) get(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error) {
	secs, err := ttlSeconds(ttl)
	if err != nil {
		return 0, err
	}
	secs += leaseSlack
	for {
		e, granter, err := ls.current(secs, ttl)
		if err != nil {
			return 0, err
		}
		if granter {
			ls.grant(ctx, e, secs, func() {
				if ls.cur[secs] == e {
					delete(ls.cur, secs)
				}
			})
		}
		select {
		case <-e.ready:
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
		switch {
		case e.err != nil && ctx.Err() == nil && (errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.DeadlineExceeded)):
			continue // the context of the caller that granted ended, not ours
		case e.err != nil:
			return 0, e.err
		case time.Until(e.until) > ttl:
			return e.id, nil
		}
		// A grant slower than the slack: grant again.
	}
}

// current returns the current lease of class secs, or a new epoch that the
// caller grants (granter) when it has no more than ttl left.
func (ls *leases) current(secs int64, ttl time.Duration) (e *epoch, granter bool, err error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil, false, ErrClosed
	}
	if e := ls.cur[secs]; e != nil {
		select {
		case <-e.ready:
			if e.err == nil && time.Until(e.until) > ttl {
				return e, false, nil
			}
		default: // being granted
			return e, false, nil
		}
	}
	e = &epoch{ready: make(chan struct{})}
	ls.cur[secs] = e
	return e, true, nil
}

// grant grants e's lease for secs; on an error, drop (called under ls.mu)
// stops using e.
func (ls *leases) grant(ctx context.Context, e *epoch, secs int64, drop func()) {
	sent := time.Now()
	g, err := ls.s.cli.Grant(ctx, secs)
	ls.mu.Lock()
	closed := ls.closed
	switch {
	case err != nil:
		e.err = ls.s.wrap(ctx, "grant lease", "", err)
	case closed:
		e.err = ErrClosed
	default:
		e.id, e.until = g.ID, sent.Add(time.Duration(g.TTL)*time.Second)
		now := time.Now()
		ls.live = slices.DeleteFunc(ls.live, func(o *epoch) bool { return o.until.Add(time.Second).Before(now) })
		ls.live = append(ls.live, e)
	}
	if e.err != nil {
		drop()
	}
	close(e.ready)
	ls.mu.Unlock()
	if closed && err == nil {
		rctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		_, _ = ls.s.cli.Revoke(rctx, g.ID)
		cancel()
	}
}

// expired forgets lease id as the current lease of its class after etcd
// answered that it does not exist (revoked by someone else).
func (ls *leases) expired(id clientv3.LeaseID) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for secs, e := range ls.cur {
		if e.id == id {
			delete(ls.cur, secs)
		}
	}
	if ls.pres != nil && ls.pres.id == id {
		// A request that wrote on it and another lease does not tell
		// which one etcd did not know: its places may still be on it, so
		// KeepPresence keeps it until etcd says it is gone.
		ls.park(ls.pres)
		ls.pres = nil
	}
}

// maxReplaced bounds the presences kept alive beside the current one: past
// it, the oldest is no longer kept (places still on it end with it, and
// their waiters queue again), so repeated lease errors cannot grow the
// keep-alives of each round.
const maxReplaced = 4

// park keeps e, a presence no longer current, alive with the current one;
// ls.mu is held.
func (ls *leases) park(e *epoch) {
	ls.old = append(ls.old, e)
	if len(ls.old) > maxReplaced {
		ls.old = slices.Delete(ls.old, 0, len(ls.old)-maxReplaced)
	}
}

// close revokes every lease that may still live, deleting what is on them.
func (ls *leases) close() {
	ls.mu.Lock()
	ls.closed = true
	live := ls.live
	ls.live, ls.cur, ls.pres, ls.old = nil, map[int64]*epoch{}, nil, nil
	ls.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range live {
		wg.Go(func() { _, _ = ls.s.cli.Revoke(ctx, e.id) })
	}
	wg.Wait()
}
