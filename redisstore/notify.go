package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/waiters"
)

// notifier delivers the per-key wake-ups and grants. Each key with a waiter
// has its channels (Store.Channel and this Store's Store.WaiterChannel; an
// observer's Store.ObserverChannel) subscribed on a pub/sub connection: one
// connection for a single node, one per master on a Cluster (sharded
// pub/sub, so a release reaches only the node that owns the key's slot). A
// release publishes the grant or token of the head waiter to the head's
// process, and only that waiter's channel receives a value. A channel
// lingers for defaultLinger after its last waiter left.
//
// Each connection has two goroutines, joined by Close: a receiver that
// reads messages and subscription confirmations, and a controller that sends
// SUBSCRIBE and UNSUBSCRIBE in order. A waiter only waits for its own
// channel's confirmation, bounded by its own context and confirmTimeout: it
// never holds a lock while another waiter's subscription dials.
type notifier struct {
	s       *Store
	waiters waiters.Set
	linger  time.Duration // how long a channel stays subscribed after its last waiter left
	confirm time.Duration // how long a waiter waits for its subscriptions' confirmation

	done   chan struct{} // closed by Close
	ctx    context.Context
	cancel context.CancelFunc // ends ctx, which bounds the controllers' calls, at Close
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	groups map[string]*group // "" on a single node, a master's address on a Cluster
}

// defaultLinger keeps a key's channel subscribed after its last waiter in
// this process left, so that a replica looping on one key (acquire, work,
// release, acquire again) does not SUBSCRIBE and UNSUBSCRIBE per wait, and
// its next waiter subscribes before its first acquire (Live).
const defaultLinger = 2 * time.Second

// confirmTimeout bounds a waiter's wait for Redis's confirmation of its
// subscriptions. A healthy server confirms at once, but a hung connection (a
// frozen server or proxy, a half-open TCP connection) answers nothing and
// fails nothing: without a bound the waiter would neither be woken nor poll
// until its context ended (often minutes). Past it the waiter gets an outage
// and polls. 5 s is as long as go-redis lets the dial of a new connection
// take by default (DialTimeout), and as long as etcdstore waits for a watch
// to start.
const confirmTimeout = 5 * time.Second

// group is one pub/sub connection and the channels subscribed on it.
type group struct {
	n       *notifier
	ps      *redis.PubSub
	sharded bool
	wake    chan struct{} // cap 1: the controller has pending work

	// guarded by n.mu
	chans   map[string]*subscription
	pending []string  // channels the controller must bring in line
	armed   time.Time // when the controller's linger timer fires (zero: not armed)
}

// subscription is one channel's state.
type subscription struct {
	key       string
	refs      int
	idleUntil time.Time // with refs == 0: the end of the linger
	sent      bool
	confirmed bool
	ready     chan struct{} // closed once confirmed, or with err set on failure
	err       error
}

func (n *notifier) init(s *Store) {
	n.s = s
	n.done = make(chan struct{})
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.groups = make(map[string]*group)
	n.linger = defaultLinger
	n.confirm = confirmTimeout
}

// WaitRelease implements driver.Notifier. A waiter (token != "")
// subscribes key's Channel and this Store's WaiterChannel, an observer
// (token == "") Channel and ObserverChannel, unless another waiter of the key in
// this Store already did; it returns once Redis has confirmed the
// subscriptions, so a release after WaitRelease returns is seen; ctx bounds
// the wait, and so does confirmTimeout (5 s: past it, the error wraps
// driver.ErrUnavailable). A waiter's channel gets one wake-up at once when
// the key may have changed for it since its last Acquire: when every channel was
// already subscribed (no round trip: its Acquire may have come after a
// release whose message this waiter missed), else when a GET of the lock
// after Redis confirmed the subscriptions finds the key free or granted to
// token, or fails (a release that needs the waiter to act leaves one of the
// two; any later one reaches the confirmed channel). Then one when a release names
// token (token is the new head of the queue of a free key, or the queue is
// empty; with the grant when the release granted it), and after every reconnect of the pub/sub connection (a
// wake-up may have been lost there, so every waiter re-checks). Expiry sends
// nothing: a waiter wakes at the Remaining its Acquire reported.
func (s *Store) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	chans := []string{s.Channel(key), s.ObserverChannel(key)}
	if token != "" {
		chans[1] = s.WaiterChannel(key)
	}
	var mayTake func(context.Context) bool
	if token != "" {
		mayTake = func(ctx context.Context) bool { return s.mayTake(ctx, key, token) }
	}
	return s.subscribe(ctx, "subscribe", key, chans, key, token, mayTake)
}

// mayTake reports whether token may take key now, for the wake-up at once
// of a new subscription: the lock is free or token's (a release granted
// it), or GET failed. A waiter queued behind another holder is woken by the
// next release, on its confirmed channel, and sends no Acquire before that
// (issue 33: a second acquire script per waiting acquisition).
func (s *Store) mayTake(ctx context.Context, key, token string) bool {
	pipe := s.c.Pipeline() // Client has no GET; a pipeline of one is one round trip, on a Cluster too
	get := pipe.Get(ctx, s.LockKey(key))
	_, _ = pipe.Exec(ctx)
	v, err := get.Result()
	if err != nil {
		return true // redis.Nil (free) or a failure: check with an Acquire
	}
	return strings.HasPrefix(v, token+"|") || v == token
}

// subscribe joins the channels chans (of one key: one hash slot, so one
// connection) for the waiter token registered under waiterKey in the
// notifier's waiter set, and returns once Redis confirmed every
// subscription, bounded by ctx and n.confirm. op names the call in errors.
// A waiter (token != "") is woken at once when mayTake is nil, when every channel
// was already confirmed, or when mayTake, called after the confirmations,
// reports true.
func (s *Store) subscribe(ctx context.Context, op, key string, chans []string, waiterKey, token string, mayTake func(context.Context) bool) (<-chan driver.Wake, func(), error) {
	g, err := s.notify.group(ctx, chans[0])
	if err != nil {
		return nil, nil, err
	}
	subs := make([]*subscription, len(chans))
	live := true
	s.notify.mu.Lock()
	for _, ch := range chans {
		live = live && g.confirmed(ch)
	}
	s.notify.mu.Unlock()
	check := token != "" && mayTake != nil && !live
	wake, unwake := s.notify.waiters.AddToken(waiterKey, token, token != "" && !check)
	s.notify.mu.Lock()
	for i, ch := range chans {
		subs[i] = s.notify.join(g, ch, waiterKey)
	}
	s.notify.mu.Unlock()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			unwake()
			s.notify.leave(g, chans)
		})
	}
	timeout := time.NewTimer(s.notify.confirm)
	defer timeout.Stop()
	for _, sub := range subs {
		select {
		case <-sub.ready:
			if sub.err != nil {
				stop()
				return nil, nil, s.fail(op, key, sub.err)
			}
		case <-ctx.Done():
			stop()
			return nil, nil, s.fail(op, key, ctx.Err())
		case <-timeout.C:
			stop()
			return nil, nil, fmt.Errorf("redisstore: %s %q: %w: Redis did not confirm the subscription within %v", op, key, driver.ErrUnavailable, s.notify.confirm)
		case <-s.notify.done:
			stop()
			return nil, nil, ErrClosed
		}
	}
	if check && mayTake(ctx) {
		s.notify.waiters.WakeToken(waiterKey, token)
	}
	return wake, stop, nil
}

// group returns the connection for channel ch, starting it if needed.
func (n *notifier) group(ctx context.Context, ch string) (*group, error) {
	addr := ""
	var node Client = n.s.c
	if n.s.cluster != nil {
		m, err := n.s.cluster.MasterForKey(ctx, ch)
		if err != nil {
			return nil, n.s.fail("subscribe", ch, err)
		}
		node, addr = m, m.Options().Addr
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	if g := n.groups[addr]; g != nil {
		return g, nil
	}
	g := &group{
		n: n, ps: node.Subscribe(context.Background()), sharded: n.s.cluster != nil,
		wake: make(chan struct{}, 1), chans: make(map[string]*subscription),
	}
	n.groups[addr] = g
	n.wg.Add(2)
	go g.receive()
	go g.control()
	return g, nil
}

// join adds a reference to ch's subscription, creating it if needed. n.mu
// must be held.
func (n *notifier) join(g *group, ch, key string) *subscription {
	sub := g.chans[ch]
	if sub == nil || sub.err != nil {
		sub = &subscription{key: key, ready: make(chan struct{})}
		g.chans[ch] = sub
		g.kick(ch)
	}
	sub.refs++
	return sub
}

// leave drops a reference; the controller unsubscribes a channel nobody
// waits on once its linger ends. A confirmed channel whose linger ends after
// the controller's timer fires needs no wake-up of the controller now (the
// timer finds it): a waiter that got the key returns without waking another
// goroutine of its process, which on a busy machine competes with it for a
// CPU.
func (n *notifier) leave(g *group, chs []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	idle := time.Now().Add(n.linger) // one end for a waiter's channels: they go in one UNSUBSCRIBE
	for _, ch := range chs {
		sub := g.chans[ch]
		if sub == nil {
			continue
		}
		if sub.refs--; sub.refs == 0 {
			sub.idleUntil = idle
			if !sub.confirmed || sub.err != nil || g.armed.IsZero() || g.armed.After(sub.idleUntil) {
				g.kick(ch)
			}
		}
	}
}

// lingers reports whether sub (with no waiter left) stays subscribed until
// now: confirmed, and its linger not over. n.mu must be held.
func (sub *subscription) lingers(now time.Time) bool {
	return sub.confirmed && sub.err == nil && now.Before(sub.idleUntil)
}

// expired returns the lingering channels whose linger ended, and how long
// until the next one ends (0 when none lingers). n.mu must be held.
func (g *group) expired(now time.Time) (chs []string, next time.Duration) {
	for ch, sub := range g.chans {
		if sub.refs > 0 || !sub.confirmed || sub.err != nil {
			continue
		}
		if d := sub.idleUntil.Sub(now); d > 0 {
			if next == 0 || d < next {
				next = d
			}
			continue
		}
		chs = append(chs, ch)
	}
	return chs, next
}

// kick queues ch for the controller. n.mu must be held.
func (g *group) kick(ch string) {
	g.pending = append(g.pending, ch)
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// control sends SUBSCRIBE for channels with waiters and UNSUBSCRIBE for
// channels without, in the order they were asked for.
func (g *group) control() {
	defer g.n.wg.Done()
	linger := time.NewTimer(time.Hour) // the next end of a channel's linger
	defer linger.Stop()
	for {
		select {
		case <-g.n.done:
			return
		case <-g.wake:
		case <-linger.C:
		}
		g.n.mu.Lock()
		pending := g.pending
		g.pending = nil
		now := time.Now()
		ended, next := g.expired(now)
		g.armed = time.Time{}
		if next > 0 {
			g.armed = now.Add(next)
		} else {
			next = time.Hour
		}
		g.n.mu.Unlock()
		g.syncAll(append(pending, ended...))
		linger.Reset(next)
	}
}

// syncAll brings the channels chs in line with their waiters, in order:
// consecutive channels to subscribe (or to unsubscribe) go in one SUBSCRIBE
// (UNSUBSCRIBE), so a waiter's two channels cost one command each way, not
// two (issue 33: every message is a write on the Redis server); on a
// Cluster, only channels of one slot go together.
func (g *group) syncAll(chs []string) {
	var (
		op    int // 0, opSubscribe or opUnsubscribe: what batch waits for
		batch []string
		subs  []*subscription
	)
	flush := func() {
		switch {
		case len(batch) == 0:
		case op == opSubscribe:
			if err := g.subscribe(batch...); err != nil {
				g.n.mu.Lock()
				for i, ch := range batch {
					g.fail(ch, subs[i], err)
				}
				g.n.mu.Unlock()
				_ = g.unsubscribe(batch...) // or go-redis subscribes them again on its next reconnect
			}
		default:
			_ = g.unsubscribe(batch...) // on a broken connection go-redis forgets them anyway
		}
		batch, subs = batch[:0], subs[:0]
	}
	for _, ch := range chs {
		next, sub := g.plan(ch)
		if next == 0 {
			continue
		}
		if next != op || (g.sharded && len(batch) > 0 && hashTag(ch) != hashTag(batch[0])) {
			flush() // SSUBSCRIBE and SUNSUBSCRIBE take channels of one slot
			op = next
		}
		batch, subs = append(batch, ch), append(subs, sub)
	}
	flush()
}

// hashTag returns what Redis hashes of ch to pick its Cluster slot: the
// text between its first '{' and the next '}', when not empty, else ch.
func hashTag(ch string) string {
	if i := strings.IndexByte(ch, '{'); i >= 0 {
		if j := strings.IndexByte(ch[i+1:], '}'); j > 0 {
			return ch[i+1 : i+1+j]
		}
	}
	return ch
}

const (
	opSubscribe = 1 + iota
	opUnsubscribe
)

// plan decides what ch needs, and marks it so: opSubscribe (it has
// waiters and was not sent), opUnsubscribe (nobody waits and its linger
// ended; it is forgotten here) or 0. A subscription sent but not confirmed
// stays until its confirmation (confirm then asks again): a confirmation
// always finds its own subscription, also after a waiter gave up on a hung
// connection and after go-redis subscribed the channel again on a new one.
func (g *group) plan(ch string) (int, *subscription) {
	n := g.n
	n.mu.Lock()
	defer n.mu.Unlock()
	sub := g.chans[ch]
	switch {
	case sub == nil:
	case sub.refs > 0 && !sub.sent:
		sub.sent = true
		return opSubscribe, sub
	case sub.refs == 0 && sub.lingers(time.Now()):
	case sub.refs == 0 && sub.sent && !sub.confirmed && sub.err == nil:
	case sub.refs == 0:
		delete(g.chans, ch)
		if sub.sent {
			return opUnsubscribe, sub
		}
	}
	return 0, nil
}

// fail ends a subscription that could not be sent. n.mu must be held.
func (g *group) fail(ch string, sub *subscription, err error) {
	if sub.confirmed || sub.err != nil {
		return
	}
	sub.err = err
	close(sub.ready)
	if g.chans[ch] == sub {
		delete(g.chans, ch)
	}
}

// opContext bounds one SUBSCRIBE or UNSUBSCRIBE; Close ends it.
func (g *group) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(g.n.ctx, 10*time.Second)
}

func (g *group) subscribe(chs ...string) error {
	ctx, cancel := g.opContext()
	defer cancel()
	if g.sharded {
		return g.ps.SSubscribe(ctx, chs...)
	}
	return g.ps.Subscribe(ctx, chs...)
}

func (g *group) unsubscribe(chs ...string) error {
	ctx, cancel := g.opContext()
	defer cancel()
	if g.sharded {
		return g.ps.SUnsubscribe(ctx, chs...)
	}
	return g.ps.Unsubscribe(ctx, chs...)
}

// receive reads the connection until Close. After an error go-redis
// reconnects on the next Receive and subscribes every channel again; the
// first confirmation after that wakes every waiter to re-check.
func (g *group) receive() {
	defer g.n.wg.Done()
	broken := false
	backoff := 50 * time.Millisecond
	for {
		msg, err := g.ps.Receive(context.Background())
		if err != nil {
			if g.isClosed() {
				return
			}
			broken = true
			select {
			case <-g.n.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			g.deliver(m)
		case *redis.Subscription:
			if broken {
				broken = false
				g.n.waiters.WakeAll()
			}
			g.confirm(m)
		}
	}
}

func (g *group) isClosed() bool {
	select {
	case <-g.n.done:
		return true
	default:
		return false
	}
}

// deliver wakes the waiter a release named ("" names every waiter of the
// key), with the grant a release made to it ("TOKEN|FENCE|TTL_MS").
func (g *group) deliver(m *redis.Message) {
	n := g.n
	n.mu.Lock()
	sub := g.chans[m.Channel]
	n.mu.Unlock()
	if sub == nil {
		return
	}
	if m.Payload == "" {
		n.waiters.Wake(sub.key)
		return
	}
	token, grant, granted := strings.Cut(m.Payload, "|")
	w, ok := parseGrant(grant)
	if !granted || !ok {
		n.waiters.WakeToken(sub.key, token)
		return
	}
	n.waiters.Hand(sub.key, token, w)
}

// parseGrant parses "FENCE|TTL_MS".
func parseGrant(grant string) (driver.Wake, bool) {
	f, ttl, _ := strings.Cut(grant, "|")
	fence, err := strconv.ParseUint(f, 10, 64)
	if err != nil || fence == 0 {
		return driver.Wake{}, false
	}
	ms, err := strconv.ParseInt(ttl, 10, 64)
	if err != nil || ms <= 0 {
		return driver.Wake{}, false
	}
	return driver.Wake{Fence: fence, TTL: time.Duration(ms) * time.Millisecond}, true
}

// Live implements driver.LiveNotifier: whether key's channel is subscribed and
// confirmed on a notification connection of this Store (a waiter of the key
// keeps it, or its linger has not ended).
func (s *Store) Live(key string) bool {
	n := &s.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, g := range n.groups {
		if g.confirmed(s.Channel(key)) && g.confirmed(s.WaiterChannel(key)) {
			return true
		}
	}
	return false
}

// confirmed reports whether ch is subscribed on g. n.mu must be held.
func (g *group) confirmed(ch string) bool {
	sub := g.chans[ch]
	return sub != nil && sub.confirmed && sub.err == nil
}

// confirm marks a subscription confirmed by Redis. A subscription that
// Redis ended on its own (a Cluster slot moved: "sunsubscribe" we did not
// ask for) wakes every waiter, who then re-check by polling.
func (g *group) confirm(m *redis.Subscription) {
	n := g.n
	n.mu.Lock()
	defer n.mu.Unlock()
	switch m.Kind {
	case "subscribe", "ssubscribe":
		if sub := g.chans[m.Channel]; sub != nil && sub.sent && !sub.confirmed && sub.err == nil {
			sub.confirmed = true
			close(sub.ready)
			if sub.refs == 0 {
				g.kick(m.Channel) // its waiters gave up: it lingers from their leave
			}
		}
	case "sunsubscribe":
		if sub := g.chans[m.Channel]; sub != nil && sub.refs > 0 {
			n.waiters.Wake(sub.key)
		}
	}
}

// Close stops the notification connections and waits for their goroutines.
// It releases no lock and leaves no queue: the Locker releases what it holds
// and takes its waiters out of their queues on its own Close, and a lock or
// queue entry nobody releases ends at its TTL in Redis. It does not close
// the client. Later WaitRelease calls return ErrClosed; the other methods
// keep working. Close is idempotent.
func (s *Store) Close() error {
	n := &s.notify
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	close(n.done)
	n.cancel()
	groups := n.groups
	n.groups = nil
	n.mu.Unlock()
	var errs []error
	for _, g := range groups {
		if err := g.ps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	n.wg.Wait()
	return errors.Join(errs...)
}
