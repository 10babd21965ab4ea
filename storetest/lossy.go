package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// lossyStore forwards every call and capability to a store and loses the
// reply of a fraction of the Acquire and Release calls after the store
// applied them, as a network that drops a reply would: the caller gets
// errLostReply and must clean up after a request that took effect.
type lossyStore struct {
	s    driver.Store
	loss float64 // probability of losing a reply

	mu   sync.Mutex
	rng  *rand.Rand
	hist map[string][]string // token -> what happened to its calls, for failure messages
	keys map[string][]string // key -> every call, for failure messages
}

func newLossy(s driver.Store, loss float64, seed uint64) *lossyStore {
	return &lossyStore{s: s, loss: loss, rng: rand.New(rand.NewPCG(seed, 0x6c6f7373)), hist: map[string][]string{}, keys: map[string][]string{}}
}

// note records what happened to a call of token.
func (w *lossyStore) note(key, token, what string, start time.Time, ctx context.Context, err error) {
	ended := ""
	if ctx.Err() != nil {
		ended = ", its context ended"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	line := fmt.Sprintf("%s %s→%s (%v%s): %v",
		what, start.Format("15:04:05.000"), time.Now().Format("05.000"), time.Since(start).Round(time.Millisecond), ended, err)
	w.hist[token] = append(w.hist[token], line)
	w.keys[key] = append(w.keys[key], fmt.Sprintf("%.8s %s", token, line))
}

// calls returns every call on key.
func (w *lossyStore) calls(key string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.keys[key]
}

// history returns what happened to the calls of token.
func (w *lossyStore) history(token string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hist[token]
}

// forget drops the history.
func (w *lossyStore) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.hist)
	clear(w.keys)
}

func (w *lossyStore) lost() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.Float64() < w.loss
}

func (w *lossyStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	start := time.Now()
	g, err := w.s.Acquire(ctx, req)
	if w.lost() {
		err = errors.Join(errLostReply, err)
		g = driver.Grant{}
	}
	w.note(req.Key, req.Token, fmt.Sprintf("acquire(queue %v)", req.QueueTTL), start, ctx, err)
	if errors.Is(err, errLostReply) {
		return g, errLostReply
	}
	return g, err
}

func (w *lossyStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	return w.s.Renew(ctx, key, token, ttl)
}

func (w *lossyStore) Release(ctx context.Context, key, token string) error {
	start := time.Now()
	err := w.s.Release(ctx, key, token)
	if w.lost() {
		err = errors.Join(errLostReply, err)
	}
	w.note(key, token, "release", start, ctx, err)
	if errors.Is(err, errLostReply) {
		return errLostReply
	}
	return err
}

func (w *lossyStore) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	return w.s.(driver.Inspector).Inspect(ctx, key)
}

func (w *lossyStore) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	return w.s.(driver.Inspector).List(ctx, prefix)
}

var errNoNotifier = errors.New("storetest: the store cannot notify")

func (w *lossyStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	n, ok := w.s.(driver.Notifier)
	if !ok {
		return nil, nil, errNoNotifier
	}
	return n.WaitRelease(ctx, key, token)
}

func (w *lossyStore) Live(key string) bool {
	n, ok := w.s.(driver.LiveNotifier)
	return ok && n.Live(key)
}

func (w *lossyStore) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	if b, ok := w.s.(driver.BatchRenewer); ok {
		return b.RenewBatch(ctx, reqs)
	}
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = w.s.Renew(ctx, r.Key, r.Token, r.TTL)
	}
	return errs
}

var (
	_ driver.Inspector    = (*lossyStore)(nil)
	_ driver.Notifier     = (*lossyStore)(nil)
	_ driver.LiveNotifier = (*lossyStore)(nil)
	_ driver.BatchRenewer = (*lossyStore)(nil)
)

// lossyRefresher is a lossyStore over a store with driver.QueueRefresher,
// which it forwards, losing the replies of a fraction of the refreshes it
// applied.
type lossyRefresher struct {
	*lossyStore
	rq driver.QueueRefresher
}

// withRefresher returns w, with RefreshQueue when its store has it.
func (w *lossyStore) withRefresher() driver.Store {
	if rq, ok := w.s.(driver.QueueRefresher); ok {
		return lossyRefresher{w, rq}
	}
	return w
}

func (w lossyRefresher) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	start := time.Now()
	errs := w.rq.RefreshQueue(ctx, reqs)
	for i, r := range reqs {
		if i < len(errs) && w.lost() {
			errs[i] = errLostReply
		}
		if i < len(errs) {
			w.note(r.Key, r.Token, "refresh", start, ctx, errs[i])
		}
	}
	return errs
}

var _ driver.QueueRefresher = lossyRefresher{}
