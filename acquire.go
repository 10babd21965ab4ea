package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// firstBackoff is the first wait before retrying a key that the store says
// is still held with no time left (Redis's PTTL rounds the last millisecond
// down to 0) or cannot tell: the holder's expiry is at most a millisecond
// away, so the head retries at once, doubling up to WaitCap.
const firstBackoff = time.Millisecond

// keyOps is what an acquisition and its lease go through to the store: the
// Store's lock operations, or a semaphore's permit operations. It is the
// engine's one hook for semaphores: everything else about a lease (renewal,
// failure budget, local guard, causes, fail-open, max hold) is shared.
type keyOps interface {
	acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error)
	renew(ctx context.Context, key, token string, ttl time.Duration) error
	release(ctx context.Context, key, token string) error
	// canWait reports whether wait works; wait subscribes token's wake-ups.
	canWait() bool
	wait(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error)
	// gated reports whether acquisitions take the key's local gate (one
	// lease per key and process); permits do not.
	gated() bool
	// batchable reports whether renewals may go through BatchRenewer.
	batchable() bool
	// permit reports whether these are a semaphore's permit operations
	// (Event.Permit).
	permit() bool
}

// opsOf returns the operations of an acquisition.
func (l *Locker) opsOf(spec leaseSpec) keyOps {
	if spec.ops != nil {
		return spec.ops
	}
	return lockOps{l}
}

// lockOps are the Store's lock operations.
type lockOps struct{ l *Locker }

func (o lockOps) acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return o.l.store.Acquire(ctx, req)
}

func (o lockOps) renew(ctx context.Context, key, token string, ttl time.Duration) error {
	return o.l.store.Renew(ctx, key, token, ttl)
}

func (o lockOps) release(ctx context.Context, key, token string) error {
	return o.l.store.Release(ctx, key, token)
}

func (o lockOps) canWait() bool { return o.l.notifier != nil }

func (o lockOps) wait(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	return o.l.notifier.WaitRelease(ctx, key, token)
}

func (lockOps) gated() bool     { return true }
func (lockOps) batchable() bool { return true }
func (lockOps) permit() bool    { return false }

// batchable reports whether every lease of a renewal batch may be renewed
// with one RenewBatch.
func batchable(leases []*Lease) bool {
	for _, ls := range leases {
		if !ls.ops.batchable() {
			return false
		}
	}
	return true
}

// renewEach renews leases one by one, concurrently, and returns one error per
// lease: a batch that holds permits, which RenewBatch cannot renew.
func renewEach(ctx context.Context, leases []*Lease) []error {
	errs := make([]error, len(leases))
	var wg sync.WaitGroup
	for i, ls := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ls.ops.renew(ctx, ls.key, ls.token, ls.ttl)
		}()
	}
	wg.Wait()
	return errs
}

// attempt is one call of TryAcquire, Acquire, Hold or Do's acquisition: one
// token, possibly several store requests.
type attempt struct {
	l     *Locker
	spec  leaseSpec
	token string
	start time.Time
	gate  *gateEntry
	ops   keyOps

	seen    bool // a store answer showed another owner (or waiters ahead)
	queued  bool // the store may hold our token in the key's queue
	wake    <-chan driver.Wake
	stopSub func()
	subDone bool // subscription tried (it is tried once)
	backoff time.Duration
	place   *place    // kept by the Locker's keeper while subscribed and queued
	kept    bool      // the last request was kept by the presence (driver.PresenceKeeper)
	present time.Time // when the presence was last kept before that request
}

// acquire is the one acquire path.
func (l *Locker) acquire(ctx context.Context, spec leaseSpec) (*Lease, error) {
	if err := ValidateKey(spec.key); err != nil {
		return nil, err
	}
	if l.ctx.Err() != nil {
		return nil, ErrLockerClosed
	}
	a := &attempt{l: l, spec: spec, token: NewToken(), start: time.Now(), backoff: firstBackoff, ops: l.opsOf(spec)}
	if cerr := ctx.Err(); cerr != nil { // no lease for it (see granted), so no request either
		return nil, a.contended(joinErrors(a.gaveUp(), cerr))
	}
	if err := a.enterGate(ctx); err != nil {
		return nil, err
	}
	defer a.unsubscribe()
	defer a.leavePlace()
	lease, err := a.run(ctx)
	if lease == nil {
		l.gate.unlock(a.gate)
	}
	return lease, err
}

// enterGate takes the key's local gate: waiting (FIFO) for a waiting
// acquire, else at once or not at all.
func (a *attempt) enterGate(ctx context.Context) error {
	l := a.l
	if !a.ops.gated() {
		return nil
	}
	if !a.spec.wait {
		entry, ok := l.gate.tryLock(a.spec.key)
		if !ok {
			l.observe(Event{Kind: EventContention, Key: a.spec.key})
			return a.contended(fmt.Errorf("%w: %q is held by another goroutine of this process", ErrNotAcquired, a.spec.key))
		}
		a.gate = entry
		return nil
	}
	entry, err := l.gate.lock(ctx, a.spec.key, l.ctx.Done())
	switch {
	case errors.Is(err, ErrLockerClosed):
		return err
	case err != nil:
		return a.contended(joinErrors(a.gaveUp(), err))
	}
	a.gate = entry
	return nil
}

// run sends acquire requests until the key is granted, the store fails, or
// (waiting) ctx ends. A waiting acquire whose key's notifications are
// already live in this process subscribes first: then a release between its
// acquire and its wait cannot be missed, and the wake-up the store put on
// the channel at once is covered by that acquire.
func (a *attempt) run(ctx context.Context) (*Lease, error) {
	l := a.l
	if a.spec.wait && a.live() && a.subscribe(ctx) {
		select {
		case <-a.wake:
		default:
		}
	}
	reqCtx := ctx // the store requests' context
	for {
		sent := time.Now()
		g, err := a.send(reqCtx, a.request())
		switch {
		case err == nil:
			return a.granted(ctx, g, sent, a.spec.ttl)
		case errors.Is(err, ErrNotAcquired):
			a.seen = true
			l.observe(Event{Kind: EventContention, Key: a.spec.key})
			if !a.spec.wait {
				return nil, a.contended(fmt.Errorf("%w: %q is held by another owner (%v left, %d waiting)", ErrNotAcquired, a.spec.key, g.Remaining, g.Ahead))
			}
			if !a.queued {
				// From its first place in the queue until it returns, a
				// waiting acquire is one that Close waits for (Close
				// returns after it left the queue, even when it was
				// between two requests), and its requests end when the
				// Locker closes.
				a.queued = true
				if !l.enterWait() {
					a.leave(ctx)
					return nil, ErrLockerClosed
				}
				defer l.waiting.Done()
				var stop context.CancelFunc
				reqCtx, stop = a.boundByLocker(ctx)
				defer stop()
			}
			w, err := a.waitTurn(reqCtx, g, sent)
			if err != nil {
				return nil, err
			}
			if lease, ok, err := a.handedOff(ctx, w, sent); ok {
				return lease, err
			}
		case a.queued && l.ctx.Err() != nil:
			a.leave(ctx)
			return nil, ErrLockerClosed
		default:
			return a.failed(ctx, sent, err)
		}
	}
}

// inFlightGrace is how long an acquire request in flight when its caller's
// context ends may still take to answer.
const inFlightGrace = 250 * time.Millisecond

// send sends one acquire request. When ctx ends while the request is in
// flight, the request gets inFlightGrace more to answer: a grant that comes
// back then is released after it (see granted). Cancelled at once, the
// request could still be applied by the server after the clean-up release
// sent beside it, and leave a lock without owner until its TTL.
func (a *attempt) send(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if ctx.Done() == nil {
		return a.ops.acquire(ctx, req)
	}
	var rctx context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok { // clients that time out by the deadline (go-redis ContextTimeoutEnabled) see the grace too
		rctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl.Add(inFlightGrace))
	} else {
		rctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	}
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(inFlightGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-rctx.Done(): // answered
		}
	})
	defer stop()
	return a.ops.acquire(rctx, req)
}

// boundByLocker returns ctx, also ended when the Locker closes, and the
// function that frees it.
func (a *attempt) boundByLocker(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(a.l.ctx, cancel)
	return bctx, func() { stop(); cancel() }
}

func (a *attempt) request() driver.AcquireRequest {
	req := driver.AcquireRequest{Key: a.spec.key, Token: a.token, TTL: a.spec.ttl, Holder: a.l.opts.Identity}
	if a.spec.wait {
		req.QueueTTL = a.l.opts.WaiterTTL
		if a.place != nil {
			req.Kept, a.present = a.l.keep.keptFor()
		}
	}
	a.kept = req.Kept > 0
	return req
}

// granted turns the store's grant into a lease, unless ctx ended: a caller
// whose context ended never gets a lease, so a grant that raced its giving
// up is released by the Locker and the caller gets ctx's error (matching
// ErrNotAcquired too). The store keeps the grant for valid from sent.
func (a *attempt) granted(ctx context.Context, g driver.Grant, sent time.Time, valid time.Duration) (*Lease, error) {
	if cerr := ctx.Err(); cerr != nil {
		a.l.background(ctx, a.ops, a.spec.key, a.token)
		return nil, a.contended(joinErrors(a.gaveUp(), cerr))
	}
	lease, err := a.l.newLease(ctx, a.spec, grant{token: a.token, fence: g.Fence, sent: sent, valid: valid, gate: a.gate})
	if err != nil {
		return nil, err
	}
	a.l.observe(Event{Kind: EventAcquire, Key: a.spec.key, Result: ResultAcquired, Fence: g.Fence, Duration: time.Since(a.start), Permit: a.ops.permit()})
	a.l.checkConfigOnce()
	if lease.debugOn() {
		lease.log().DebugContext(lease.ctx, "leasehold: lease acquired", slog.Duration("waited", time.Since(a.start)))
	}
	return lease, nil
}

// live reports whether the key's wake-ups are already subscribed in this
// process (driver.LiveNotifier), for a lock attempt.
func (a *attempt) live() bool {
	if _, lock := a.ops.(lockOps); !lock {
		return false
	}
	ln, ok := a.l.notifier.(driver.LiveNotifier)
	return ok && ln.Live(a.spec.key)
}

// handedOff takes the lease a release granted to this waiter, when the
// wake-up w carries one, without another acquire request: the lease is then
// what an acquire sent at sent (the waiter's last, queued, acquire) would
// have granted, since the store's expiry is at least min(TTL, WaiterTTL)
// after it. A grant capped by the queue deadline (TTL > WaiterTTL) is
// trusted for WaiterTTL only, and its first renewal, due within a third of
// that, extends the lock to the full TTL; a hold (never renewed) needs its
// whole TTL and takes such a grant with another acquire. A grant that is
// not for this TTL, or one that came after the lease's first renewal would
// have been due, is left to the next acquire, which finds the token holding
// the key and extends its TTL.
func (a *attempt) handedOff(ctx context.Context, w driver.Wake, sent time.Time) (*Lease, bool, error) {
	if _, lock := a.ops.(lockOps); !lock || w.Fence == 0 {
		return nil, false, nil
	}
	if a.place != nil {
		sent = a.l.keep.keptSince(a.place) // our last acquire, or a refresh since
	}
	o := &a.l.opts
	ttl := a.spec.ttl.Truncate(time.Millisecond)
	span := a.spec.ttl // how long the store keeps the grant from sent
	if wt := o.WaiterTTL.Truncate(time.Millisecond); ttl > wt {
		span = wt
	}
	fresh := min(o.RenewInterval, (span-o.drift(span))/2)
	if w.TTL != ttl || (span < a.spec.ttl && a.spec.kind != renewed) || time.Since(sent) >= fresh {
		return nil, false, nil
	}
	lease, err := a.granted(ctx, driver.Grant{Fence: w.Fence}, sent, span)
	return lease, true, err
}

// contended reports a contended acquisition and returns err.
func (a *attempt) contended(err error) error {
	a.l.observe(Event{Kind: EventAcquire, Key: a.spec.key, Result: ResultContended, Duration: time.Since(a.start)})
	return err
}

func (a *attempt) gaveUp() error {
	return fmt.Errorf("%w: %q: gave up waiting", ErrNotAcquired, a.spec.key)
}

// failed handles a store failure: it cleans up whatever the store may have
// applied (an acquire whose reply was lost, our place in the queue), then
// follows OnStoreError. A deadline after the store had shown another owner is
// contention; without such an answer it is a store failure. Fail-open
// applies only to an error the store marked ErrUnavailable (an outage), never
// after another owner was seen, and never once ctx ended: the error then also
// matches ctx's error.
func (a *attempt) failed(ctx context.Context, sent time.Time, err error) (*Lease, error) {
	l, key := a.l, a.spec.key
	l.background(ctx, a.ops, key, a.token)
	if cerr := ctx.Err(); cerr != nil && a.seen {
		return nil, a.contended(joinErrors(a.gaveUp(), cerr))
	}
	serr := storeErr("acquire", key, err)
	l.observe(Event{Kind: EventStoreError, Key: key, Op: "acquire", Err: err})
	l.observe(Event{Kind: EventAcquire, Key: key, Result: ResultError, Duration: time.Since(a.start), Err: err})
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(serr, cerr) {
			return nil, serr
		}
		return nil, joinErrors(serr, cerr)
	}
	if l.opts.OnStoreError != FailOpen || a.seen || !errors.Is(err, ErrUnavailable) {
		return nil, serr
	}
	l.observe(Event{Kind: EventFailOpen, Key: key, Err: err, Permit: a.ops.permit()})
	l.opts.Logger.ErrorContext(ctx, "leasehold: store failed, failing open with a local-only lease: cross-replica races are now possible",
		slog.String("locker", l.opts.Name), slog.String("key", key), slog.String("holder", l.opts.Identity), slog.Any("error", err))
	return l.newLease(ctx, a.spec, grant{token: a.token, sent: sent, degraded: true, gate: a.gate})
}

// waitTurn waits until the next acquire request is worth sending: a wake-up
// from the store (returned: it may carry a hand-off), the holder's exact
// remaining TTL when nobody is ahead, the refresh of our place in the queue
// (WaiterTTL/3), or WaitCap. While subscribed, the Locker's keeper refreshes
// the place instead (see keeper) and wakes us when the refresh did not find
// us queued behind a holder. Right after subscribing, a wake-up the store
// put on the channel at once (it may have missed a change since our
// acquire) returns at once. It returns an error when ctx ends or the Locker
// closes, after leaving the queue.
func (a *attempt) waitTurn(ctx context.Context, g driver.Grant, sent time.Time) (driver.Wake, error) {
	if a.subscribe(ctx) {
		if w, ok := a.woken(); ok {
			return w, nil
		}
	}
	a.keepPlace(sent, g)
	var timer <-chan time.Time
	if next := a.nextTry(g, sent); !next.IsZero() {
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		timer = t.C
	}
	select {
	case w := <-a.wake:
		return w, nil
	case <-a.stale():
		return driver.Wake{}, nil
	case <-timer:
		w, _ := a.woken() // a hand-off that came with the timer
		return w, nil
	case <-ctx.Done():
		a.leave(ctx)
		if a.l.ctx.Err() != nil {
			return driver.Wake{}, ErrLockerClosed // ctx is bound by the Locker
		}
		return driver.Wake{}, a.contended(joinErrors(a.gaveUp(), ctx.Err()))
	case <-a.l.ctx.Done():
		a.leave(ctx)
		return driver.Wake{}, ErrLockerClosed
	}
}

// woken returns a wake-up waiting on the subscription, without blocking.
func (a *attempt) woken() (driver.Wake, bool) {
	select {
	case w := <-a.wake:
		return w, true
	default:
		return driver.Wake{}, false
	}
}

// nextTry returns when to send the next acquire request; zero: only on a
// wake-up (a kept place behind other waiters).
func (a *attempt) nextTry(g driver.Grant, sent time.Time) time.Time {
	o := &a.l.opts
	next := earliest(sent.Add(o.WaiterTTL/3), time.Now().Add(o.WaitCap))
	if a.place != nil {
		switch {
		case g.Ahead > 0:
			return time.Time{}
		case g.Remaining > 0:
			return sent.Add(g.Remaining) // next in line: the holder's exact expiry
		}
	}
	switch {
	case g.Ahead == 0 && g.Remaining > 0 && g.Remaining < o.WaiterTTL/2:
		// Next in line, with the holder's expiry before the place needs
		// a refresh: that retry is the refresh. Refreshing first, a
		// little before the expiry (TTL = WaiterTTL/3, the defaults),
		// would cost a request that is refused.
		next = earliest(time.Now().Add(o.WaitCap), sent.Add(g.Remaining))
	case g.Ahead == 0 && g.Remaining > 0:
		next = earliest(next, sent.Add(g.Remaining)) // next in line: the holder's exact expiry
	case g.Ahead == 0:
		// Free, or the store cannot tell: back off, doubling up to WaitCap.
		next = earliest(next, time.Now().Add(a.backoff))
		a.backoff = min(2*a.backoff, o.WaitCap)
	}
	return next
}

// keepPlace hands our place in the queue, which the acquire sent at sent
// kept, to the Locker's keeper: a lock attempt that is subscribed, over a
// store that can refresh places.
func (a *attempt) keepPlace(sent time.Time, g driver.Grant) {
	k := a.l.keep
	head := g.Ahead == 0 && g.Remaining > 0
	switch {
	case a.place != nil:
		k.requeued(a.place, sent, a.kept, a.present, head)
	case k != nil && a.wake != nil:
		if _, lock := a.ops.(lockOps); lock {
			a.place = k.join(a.spec.key, a.token, sent, a.kept, a.present, head)
		}
	}
}

// stale returns the channel on which the keeper asks for an acquire (nil
// without a kept place).
func (a *attempt) stale() <-chan struct{} {
	if a.place == nil {
		return nil
	}
	return a.place.stale
}

func (a *attempt) leavePlace() {
	if a.place != nil {
		a.l.keep.leave(a.place)
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// subscribe subscribes to the key's wake-ups the first time it is called,
// bounded by ctx. It reports whether it subscribed just now.
func (a *attempt) subscribe(ctx context.Context) bool {
	if a.subDone || !a.ops.canWait() {
		return false
	}
	a.subDone = true
	ch, stop, err := a.ops.wait(ctx, a.spec.key, a.token)
	if err != nil {
		a.l.opts.Logger.DebugContext(ctx, "leasehold: no release notifications; polling", slog.String("locker", a.l.opts.Name),
			slog.String("key", a.spec.key), slog.Any("error", err))
		return false
	}
	a.wake, a.stopSub = ch, stop
	return true
}

func (a *attempt) unsubscribe() {
	if a.stopSub != nil {
		a.stopSub()
	}
}

// leave takes our token out of the key's queue (and releases a grant that
// raced with giving up), in the background, owned by the Locker.
func (a *attempt) leave(ctx context.Context) {
	if a.queued {
		a.l.background(ctx, a.ops, a.spec.key, a.token)
	}
}

// joinedError is several errors in one line, each matched by errors.Is and
// errors.As (errors.Join prints one per line).
type joinedError []error

// Error joins the messages with ": ".
func (e joinedError) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, ": ")
}

// Unwrap returns the errors.
func (e joinedError) Unwrap() []error { return e }

// joinErrors is errors.Join on one line: nil for no errors, the error itself
// for one.
func joinErrors(errs ...error) error {
	var out joinedError
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}
