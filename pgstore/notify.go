package pgstore

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/waiters"
)

// listener is the store's one LISTEN connection, shared by every waiter: its
// goroutine hands each released key to that key's waiters, and re-opens the
// connection when it is lost.
type listener struct {
	s       *Store
	startMu sync.Mutex // serialises opening the first connection

	mu      sync.Mutex
	waiters waiters.Set
	running bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine has exited
}

func (l *listener) init(s *Store) {
	l.s = s
}

// WaitRelease implements leasehold.Notifier. The first call opens the
// store's one LISTEN connection (see Options.Listen) and returns after the
// server confirmed LISTEN, so a release after WaitRelease returns is seen;
// later calls only register the waiter. While a lost connection is being
// re-opened, notifications are missed (waiters then wake at the holder's
// TTL); when it is back every waiter is woken once, to try again. Expiry
// sends no notification.
func (s *Store) WaitRelease(ctx context.Context, key, _ string) (<-chan struct{}, func(), error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	l := &s.lis
	if err := l.start(ctx); err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil, nil, ErrClosed
	}
	ch, stop := l.waiters.Add(key)
	return ch, stop, nil
}

// start opens the connection and starts the goroutine, once.
func (l *listener) start(ctx context.Context) error {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	l.mu.Lock()
	closed, running := l.closed, l.running
	l.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case running:
		return nil
	case l.s.opts.Listen == nil:
		return ErrNoListener
	}
	conn, err := l.connect(ctx)
	if err != nil {
		return storeErr("listen", l.s.channel, err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		cancel()
		closeConn(conn)
		return ErrClosed
	}
	l.running, l.cancel, l.done = true, cancel, done
	l.mu.Unlock()
	go l.run(lctx, conn, done)
	return nil
}

// connect opens a connection and LISTENs on the channel.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := l.s.opts.Listen(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.s.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// run receives notifications until ctx ends, re-opening the connection when
// it is lost.
func (l *listener) run(ctx context.Context, conn *pgx.Conn, done chan struct{}) {
	defer close(done)
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	log := l.s.opts.Logger
	for {
		n, err := conn.WaitForNotification(ctx)
		if err == nil {
			l.wake(n.Payload)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("pgstore: LISTEN connection lost; waiters fall back on TTLs until it is back",
			"channel", l.s.channel, "err", err)
		closeConn(conn)
		if conn = l.reconnect(ctx); conn == nil {
			return
		}
		log.Info("pgstore: LISTEN connection back", "channel", l.s.channel)
		l.wakeAll() // releases while it was down were missed
	}
}

// reconnect tries to re-open the connection with capped exponential backoff
// until it succeeds (returns the connection) or ctx ends (returns nil).
func (l *listener) reconnect(ctx context.Context) *pgx.Conn {
	delay := 50 * time.Millisecond
	for {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := l.connect(cctx)
		cancel()
		if err == nil {
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		delay = min(2*delay, l.s.opts.ReconnectDelay)
	}
}

// wake tells key's waiters that it was released.
func (l *listener) wake(key string) { l.waiters.Wake(key) }

// wakeAll wakes every waiter.
func (l *listener) wakeAll() { l.waiters.WakeAll() }

// close stops the goroutine and waits for it.
func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
