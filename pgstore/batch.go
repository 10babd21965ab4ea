package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// batchSlots bounds the statements of one kind (acquire, release) a store
// has in flight, and maxBatch the calls in one: calls that find every slot
// taken wait together and go in one statement when a slot frees, instead
// of each waiting alone for one of the pool's connections (see
// BENCHMARKS.md, "Many waiting keys").
const (
	batchSlots = 4
	maxBatch   = 256
)

// batcher groups concurrent calls of one kind. A call waits for its result,
// for a free slot (it then sends the oldest waiting calls, its own among
// them when it is one of the oldest) or for its context. Its own call alone
// goes out from its goroutine, a statement of several calls from a new one
// that ends with the statement (see batchContext), so that the sender too
// returns when its context ends. send sends one statement for calls
// (sorted by key, so that two statements take the keys' advisory locks in
// one order) and sets each call's outcome.
type batcher[P any] struct {
	slots   chan struct{} // a token per statement in flight
	send    func(calls []*call[P])
	mu      sync.Mutex
	pending []*call[P] // oldest first
}

// call is one call of a batcher and, once done is closed, its outcome.
type call[P any] struct {
	ctx        context.Context
	key, token string
	p          P // arguments and results
	err        error
	sent       bool // taken into a statement (under the batcher's mu)
	done       chan struct{}
}

func newBatcher[P any](send func([]*call[P])) *batcher[P] {
	return &batcher[P]{slots: make(chan struct{}, batchSlots), send: send}
}

// do sends (key, token, p) alone or with others and returns p with its
// results.
func (b *batcher[P]) do(ctx context.Context, key, token string, p P) (P, error) {
	var zero P // me.p may be written until done is closed
	me := &call[P]{ctx: ctx, key: key, token: token, p: p, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, me)
	b.mu.Unlock()
	for {
		select {
		case <-me.done:
			return me.p, me.err
		case <-ctx.Done():
			b.drop(me) // unless sent: then it may still apply
			return zero, ctx.Err()
		case b.slots <- struct{}{}:
			calls := b.take(me)
			if len(calls) > 1 { // others' calls too: wait for them only within ctx
				go func() {
					b.sendAll(calls)
					<-b.slots
				}()
				continue
			}
			if calls != nil {
				b.sendAll(calls)
			}
			<-b.slots
			if calls == nil { // another call sent mine
				select {
				case <-me.done:
					return me.p, me.err
				case <-ctx.Done():
					return zero, ctx.Err()
				}
			}
		}
	}
}

func (b *batcher[P]) sendAll(calls []*call[P]) {
	slices.SortFunc(calls, func(x, y *call[P]) int {
		return cmp.Or(strings.Compare(x.key, y.key), strings.Compare(x.token, y.token))
	})
	b.send(calls)
	for _, c := range calls {
		close(c.done)
	}
}

// take returns the oldest pending calls, at most maxBatch, or nil when me
// was already sent.
func (b *batcher[P]) take(me *call[P]) []*call[P] {
	b.mu.Lock()
	defer b.mu.Unlock()
	if me.sent {
		return nil
	}
	n := min(len(b.pending), maxBatch)
	calls := slices.Clone(b.pending[:n])
	b.pending = slices.Delete(b.pending, 0, n)
	for _, c := range calls {
		c.sent = true
	}
	return calls
}

// drop removes me from the pending calls (when it was not sent).
func (b *batcher[P]) drop(me *call[P]) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = slices.DeleteFunc(b.pending, func(c *call[P]) bool { return c == me })
}

// batchContext returns a context with the first call's values that ends
// when the contexts of all calls have ended: a call whose own context ends
// first stops waiting for it, and no call's end cancels another's.
func batchContext[P any](calls []*call[P]) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(calls[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(calls)))
	stops := make([]func() bool, len(calls))
	for i, c := range calls {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// releaseCall is a release's outcome: res 0, 1 or 2 as the release function
// returns, kept when the fast release applied.
type releaseCall struct {
	res  int32
	kept bool
}

// sendReleases sends one release in its own statement (the fast release or
// the release function), more in one call of releaseBatchSQL.
func (s *Store) sendReleases(calls []*call[releaseCall]) {
	if len(calls) == 1 {
		c := calls[0]
		c.err = retry(c.ctx, func() error {
			return s.db.QueryRow(c.ctx, s.releaseSQL, c.key, c.token, s.channel, s.opts.Durable).Scan(&c.p.res, &c.p.kept)
		})
		return
	}
	ctx, cancel := batchContext(calls)
	defer cancel()
	keys, tokens := keysTokens(calls)
	var res []int32
	err := retry(ctx, func() error {
		return s.db.QueryRow(ctx, s.releaseBatchSQL, keys, tokens, s.channel, s.opts.Durable).Scan(&res)
	})
	if alone(ctx, err) {
		for _, c := range calls {
			s.sendReleases([]*call[releaseCall]{c})
		}
		return
	}
	if err == nil && len(res) != len(calls) {
		err = fmt.Errorf("pgstore: %d results for %d releases", len(res), len(calls))
	}
	for i, c := range calls {
		if c.err = err; err == nil {
			c.p.res = res[i]
		}
	}
}

// acquireCall is an acquire's arguments (TTL, queue TTL and kept in µs,
// holder) and what it saw.
type acquireCall struct {
	us, qus, kus     int64
	holder           string
	won              bool
	fence, remaining int64
	seenHolder       string
	ahead            int32
}

// sendAcquires sends one acquire in its own statement (the fast
// acquire or the acquire function), more in one call of acquireBatchSQL.
func (s *Store) sendAcquires(calls []*call[acquireCall]) {
	if len(calls) == 1 {
		c := calls[0]
		c.err = retry(c.ctx, func() error {
			return s.db.QueryRow(c.ctx, s.acquireSQL, c.key, c.token, c.p.us, c.p.holder, c.p.qus, s.opts.Durable, s.channel, s.wakeChannel(), c.p.kus).
				Scan(&c.p.won, &c.p.fence, &c.p.remaining, &c.p.seenHolder, &c.p.ahead)
		})
		return
	}
	ctx, cancel := batchContext(calls)
	defer cancel()
	keys, tokens := keysTokens(calls)
	us, qus, kus, holders := make([]int64, len(calls)), make([]int64, len(calls)), make([]int64, len(calls)), make([]string, len(calls))
	for i, c := range calls {
		us[i], qus[i], kus[i], holders[i] = c.p.us, c.p.qus, c.p.kus, c.p.holder
	}
	var (
		won                []bool
		fences, remainings []int64
		seen               []string
		ahead              []int32
	)
	err := retry(ctx, func() error {
		return s.db.QueryRow(ctx, s.acquireBatchSQL, keys, tokens, us, holders, qus, s.opts.Durable, s.channel, s.wakeChannel(), kus).
			Scan(&won, &fences, &remainings, &seen, &ahead)
	})
	if alone(ctx, err) {
		for _, c := range calls {
			s.sendAcquires([]*call[acquireCall]{c})
		}
		return
	}
	if err == nil && (len(won) != len(calls) || len(fences) != len(calls) || len(remainings) != len(calls) || len(seen) != len(calls) || len(ahead) != len(calls)) {
		err = fmt.Errorf("pgstore: %d results for %d acquires", len(won), len(calls))
	}
	for i, c := range calls {
		if c.err = err; err == nil {
			c.p.won, c.p.fence, c.p.remaining, c.p.seenHolder, c.p.ahead = won[i], fences[i], remainings[i], seen[i], ahead[i]
		}
	}
}

// alone reports an error the server raised for a statement of many calls
// (one key's bad row, say) while its context lasts: each call is then sent
// in a statement of its own, so that the error reaches only its own.
func alone(ctx context.Context, err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && ctx.Err() == nil
}

func keysTokens[P any](calls []*call[P]) (keys, tokens []string) {
	keys, tokens = make([]string, len(calls)), make([]string, len(calls))
	for i, c := range calls {
		keys[i], tokens[i] = c.key, c.token
	}
	return keys, tokens
}
