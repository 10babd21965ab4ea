package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/waiters"
)

// subscribeTTL is how long a WaitRelease subscription makes releases of its
// key notify, when the subscriber does not join the queue (a queued waiter
// keeps its entry alive by refreshing it).
const subscribeTTL = 5 * time.Minute

// listener is the store's one LISTEN connection, shared by every waiter: its
// goroutine hands each notification to the waiter it names (the new head of
// a key's queue) or to every subscriber of the key, and re-opens the
// connection when it is lost. It is started by the first WaitRelease and
// runs until Close; no waiter's context bounds it, and each waiter's own
// context bounds its wait for it.
type listener struct {
	s *Store

	mu   sync.Mutex
	subs map[string]map[chan driver.Wake]string // key -> wake channel -> token
	// rows counts the subscribers of each subscription row this store
	// wrote (key, token): the row is deleted when the last one stops.
	rows    map[[2]string]int
	cleanup sync.WaitGroup // deletions of subscription rows in flight
	// epoch counts the connection's ups and downs; isUp is true while it
	// LISTENs. resume holds, for each (key, token) this store queued while
	// the connection was up, the epoch when that acquire was sent; pending
	// keeps the wake-ups (and grants) that came for such a token before it
	// subscribed, for its WaitRelease (see resumes).
	epoch   uint64
	isUp    bool
	resume  map[[2]string]uint64
	pending map[[2]string]*handoff // nil: a wake-up without a grant
	started bool
	closed  bool
	up      chan struct{} // closed while the connection LISTENs; replaced when it is lost
	gone    chan struct{} // closed by Close
	lastErr error         // why the connection is down, for a waiter that gives up
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine has exited
}

func (l *listener) init(s *Store) {
	l.s = s
	l.up = make(chan struct{})
	l.gone = make(chan struct{})
}

// WaitRelease implements driver.Notifier. It registers token's waiter,
// waits (bounded by ctx) until the store's LISTEN connection is up, and
// records a subscription for key in the waiter table, so that a release of
// key notifies even when token has not joined the queue. A release that
// leaves a queue head wakes only that head's waiter; without a queue it
// wakes every subscriber of the key. When the LISTEN connection is lost,
// and again when it is back, every waiter is woken to re-check. Expiry sends
// no notification. A waiter's channel gets one wake-up at once unless
// resumes holds.
func (s *Store) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	l := &s.lis
	up, err := l.start()
	if err != nil {
		return nil, nil, err
	}
	ch, stop := l.add(key, token)
	select {
	case <-up:
	case <-l.gone:
		stop()
		return nil, nil, ErrClosed
	case <-ctx.Done():
		stop()
		err := context.Cause(ctx)
		if last := l.err(); last != nil {
			err = fmt.Errorf("%w (LISTEN connection: %w)", err, last)
		}
		return nil, nil, storeErr("listen", s.channel, err)
	}
	if token != "" && l.resumes(key, token) {
		// Its queue entry makes every release that frees the key for it
		// notify this connection since its Acquire: no subscription row,
		// no wake-up. (Otherwise the row's upsert leaves a live queue entry
		// of token as it is.)
		return ch, stop, nil
	}
	row := s.rowToken(token)
	if _, err := s.db.Exec(ctx, s.subscribeSQL, key, row, subscribeTTL.Microseconds()); err != nil {
		stop()
		return nil, nil, storeErr("subscribe", key, err)
	}
	l.addRow(key, row)
	if token != "" {
		l.wakeUnlessResumed(key, token)
	}
	var once sync.Once
	return ch, func() {
		stop()
		once.Do(func() { l.dropRow(key, row) })
	}, nil
}

// WakeChannel returns the store's own NOTIFY channel (see wakeChannel).
func (s *Store) WakeChannel() string { return s.wakeChannel() }

// wakeChannel is the store's own NOTIFY channel, which its LISTEN
// connection listens on beside the shared one: a release notifies a queue
// head there, so a hand-off wakes the head's process alone and not every
// process waiting on the table's channel. Empty when the store cannot
// LISTEN (releases then use the shared channel, which nobody here hears).
func (s *Store) wakeChannel() string {
	if s.opts.Listen == nil {
		return ""
	}
	return "leasehold.wake." + s.id
}

// rowToken is the token of token's subscription row: token itself, or for
// an observer (token "") one that is unique to this store, so that a store
// that stops observing deletes its own row and not another store's.
func (s *Store) rowToken(token string) string {
	if token == "" {
		return "observer:" + s.id
	}
	return token
}

// addRow counts a subscriber of the row (key, token).
func (l *listener) addRow(key, token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rows == nil {
		l.rows = map[[2]string]int{}
	}
	l.rows[[2]string{key, token}]++
}

// dropRow uncounts a subscriber of the row (key, token) and deletes the row
// (in the background, joined by Close) when it was the last one, so a
// finished waiter leaves nothing behind.
func (l *listener) dropRow(key, token string) {
	k := [2]string{key, token}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rows[k] == 0 {
		return // Close took it
	}
	if l.rows[k]--; l.rows[k] > 0 {
		return
	}
	delete(l.rows, k)
	if l.closed {
		return // Close deletes the rows
	}
	l.cleanup.Add(1)
	go func() {
		defer l.cleanup.Done()
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if _, err := l.s.db.Exec(ctx, l.s.unsubscribeSQL, []string{key}, []string{token}); err != nil {
			l.s.opts.Logger.Warn("pgstore: cannot delete a WaitRelease subscription; it ends at its TTL", "key", key, "err", err)
		}
	}()
}

// takeRows returns every subscription row still counted and forgets them.
func (l *listener) takeRows() (keys, tokens []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.rows {
		keys, tokens = append(keys, k[0]), append(tokens, k[1])
	}
	l.rows = nil
	return keys, tokens
}

// start starts the goroutine once and returns the channel that is closed
// while the connection is up.
func (l *listener) start() (<-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil, ErrClosed
	case l.s.opts.Listen == nil:
		return nil, ErrNoListener
	case !l.started:
		ctx, cancel := context.WithCancel(context.Background())
		l.started, l.cancel, l.done = true, cancel, make(chan struct{})
		go func() {
			defer close(l.done)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.refresh(ctx)
			}()
			l.run(ctx)
			wg.Wait()
		}()
	}
	return l.up, nil
}

func (l *listener) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastErr
}

// add registers a waiter for key and token; stop unregisters it and may be
// called more than once.
func (l *listener) add(key, token string) (<-chan driver.Wake, func()) {
	c := make(chan driver.Wake, 1)
	l.mu.Lock()
	if l.subs == nil {
		l.subs = map[string]map[chan driver.Wake]string{}
	}
	if l.subs[key] == nil {
		l.subs[key] = map[chan driver.Wake]string{}
	}
	l.subs[key][c] = token
	if h, ok := l.pending[[2]string{key, token}]; ok && token != "" {
		delete(l.pending, [2]string{key, token})
		if h != nil {
			waiters.Send(c, driver.Wake{Fence: h.fence, TTL: h.ttl})
		} else {
			poke(c)
		}
	}
	l.mu.Unlock()
	var once sync.Once
	return c, func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.subs[key], c)
			if len(l.subs[key]) == 0 {
				delete(l.subs, key)
			}
			delete(l.resume, [2]string{key, token})
			delete(l.pending, [2]string{key, token})
			l.mu.Unlock()
		})
	}
}

func poke(c chan driver.Wake) { waiters.Send(c, driver.Wake{}) }

// handoff is a grant a release made to a waiter of this store, kept for a
// waiter that has not subscribed yet (see keep).
type handoff struct {
	fence uint64
	ttl   time.Duration
}

// dispatch wakes the waiters a notification payload names: "N:" followed by
// a token of N bytes and the key (the key's new queue head, and the key's
// observers, subscribed with an empty token), "gN:" followed by the token,
// the fence, ":", the TTL in ms, ":" and the key (a release granted the key
// to that head: its wake-up carries the grant), or "*:" and the
// key (every subscriber of the key).
func (l *listener) dispatch(payload string) {
	n, rest, ok := strings.Cut(payload, ":")
	if !ok {
		return
	}
	grant := strings.HasPrefix(n, "g")
	key, token, all := rest, "", n == "*"
	if !all {
		size, err := strconv.Atoi(strings.TrimPrefix(n, "g"))
		if err != nil || size < 0 || size > len(rest) {
			return
		}
		token, key = rest[:size], rest[size:]
	}
	var h handoff
	if grant {
		if h, key, ok = parseGrant(key); !ok {
			return
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	named := false
	for c, tok := range l.subs[key] {
		named = named || tok == token
		switch {
		case grant && tok == token && !all:
			waiters.Send(c, driver.Wake{Fence: h.fence, TTL: h.ttl})
		case all || tok == token || tok == "": // observers see every hand-off
			poke(c)
		}
	}
	if k := [2]string{key, token}; !all && !named && token != "" {
		l.keep(k, grant, h)
	}
}

// keep records a wake-up for a token this store queued that has not
// subscribed yet (its WaitRelease takes it). Call with l.mu held.
func (l *listener) keep(k [2]string, grant bool, h handoff) {
	if _, ok := l.resume[k]; !ok {
		return
	}
	if l.pending == nil {
		l.pending = map[[2]string]*handoff{}
	}
	if grant {
		l.pending[k] = &h
	} else if _, ok := l.pending[k]; !ok {
		l.pending[k] = nil
	}
}

// queuedAt returns the connection's epoch and whether it is up, taken
// before a waiting acquire is sent.
func (l *listener) queuedAt() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, l.isUp
}

// expect records that token queued for key with an acquire sent in epoch.
func (l *listener) expect(key, token string, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.resume == nil {
		l.resume = map[[2]string]uint64{}
	}
	l.resume[[2]string{key, token}] = epoch
}

// forget drops what expect and keep recorded for (key, token).
func (l *listener) forget(key, token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.resume, [2]string{key, token})
	delete(l.pending, [2]string{key, token})
}

// wakeUnlessResumed puts a wake-up on token's channels of key unless
// token's last waiting Acquire of key, which queued it, was sent while the
// store's LISTEN connection was up, and the connection has stayed up since:
// every release committed after that Acquire then notified this
// connection, and a notification that came before WaitRelease was kept for
// it (add woke it), so the waiter needs no second Acquire.
func (l *listener) wakeUnlessResumed(key, token string) {
	if l.resumes(key, token) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, tok := range l.subs[key] {
		if tok == token {
			poke(c)
		}
	}
}

// resumes reports whether token's last waiting Acquire of key, which
// queued it, was sent while the LISTEN connection was up, and the
// connection has stayed up since (see wakeUnlessResumed).
func (l *listener) resumes(key, token string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.resume[[2]string{key, token}]
	return ok && l.isUp && e == l.epoch
}

// parseGrant splits "FENCE:TTLMS:KEY".
func parseGrant(s string) (handoff, string, bool) {
	f, rest, ok1 := strings.Cut(s, ":")
	ms, key, ok2 := strings.Cut(rest, ":")
	fence, err1 := strconv.ParseUint(f, 10, 64)
	ttl, err2 := strconv.ParseInt(ms, 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || fence == 0 {
		return handoff{}, "", false
	}
	return handoff{fence: fence, ttl: time.Duration(ttl) * time.Millisecond}, key, true
}

// wakeAll wakes every waiter.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, byKey := range l.subs {
		for c := range byKey {
			poke(c)
		}
	}
}

// setUp marks the connection up (waking every waiter when it was lost
// before); setDown marks it lost and wakes every waiter.
func (l *listener) setUp(again bool) {
	l.mu.Lock()
	close(l.up)
	l.lastErr = nil
	l.epoch++
	l.isUp = true
	l.mu.Unlock()
	if again {
		l.wakeAll()
	}
}

func (l *listener) setDown() {
	l.mu.Lock()
	l.up = make(chan struct{})
	l.epoch++
	l.isUp = false
	l.mu.Unlock()
	l.wakeAll()
}

// connect opens a connection and LISTENs on the channel.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := l.s.opts.Listen(ctx)
	if err != nil {
		return nil, err
	}
	for _, ch := range []string{l.s.channel, l.s.wakeChannel()} {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			closeConn(conn)
			return nil, err
		}
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// run keeps a LISTEN connection open and dispatches its notifications until
// ctx ends.
func (l *listener) run(ctx context.Context) {
	log := l.s.opts.Logger
	for again := false; ; again = true {
		conn := l.reconnect(ctx, again)
		if conn == nil {
			return
		}
		if again {
			log.Info("pgstore: LISTEN connection back", "channel", l.s.channel)
		}
		l.setUp(again)
		err := l.receive(ctx, conn)
		closeConn(conn)
		if ctx.Err() != nil {
			return
		}
		log.Warn("pgstore: LISTEN connection lost; every waiter re-checks, then falls back on TTLs until it is back",
			"channel", l.s.channel, "err", err)
		l.setDown()
	}
}

func (l *listener) receive(ctx context.Context, conn *pgx.Conn) error {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.dispatch(n.Payload)
	}
}

// reconnect opens the connection, retrying with capped exponential backoff
// (after a pause when it was lost) until it succeeds or ctx ends (nil).
func (l *listener) reconnect(ctx context.Context, pause bool) *pgx.Conn {
	delay := 50 * time.Millisecond
	for {
		if pause {
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			delay = min(2*delay, l.s.opts.ReconnectDelay)
		}
		pause = true
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := l.connect(cctx)
		cancel()
		if err == nil {
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		l.mu.Lock()
		l.lastErr = err
		l.mu.Unlock()
		l.s.opts.Logger.Warn("pgstore: cannot open the LISTEN connection", "channel", l.s.channel, "err", err)
	}
}

// refresh renews the subscription rows of every registered waiter every
// subscribeTTL/3 until ctx ends, so a long wait (an observer's) keeps
// releases of its key notifying.
func (l *listener) refresh(ctx context.Context) {
	t := time.NewTicker(subscribeTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		var subs [][2]string
		for k := range l.rows {
			subs = append(subs, k)
		}
		l.mu.Unlock()
		for _, kt := range subs {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := l.s.db.Exec(rctx, l.s.subscribeSQL, kt[0], kt[1], subscribeTTL.Microseconds())
			cancel()
			if err != nil && ctx.Err() == nil {
				l.s.opts.Logger.Warn("pgstore: cannot renew a WaitRelease subscription", "key", kt[0], "err", err)
			}
		}
	}
}

// close stops the goroutine and waits for it and for the deletions of
// subscription rows in flight.
func (l *listener) close() {
	l.mu.Lock()
	if !l.closed {
		close(l.gone)
	}
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	l.cleanup.Wait()
}
