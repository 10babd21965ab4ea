package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/redisstore"
)

// errUnanswered is an ownership check the drill could not answer.
var errUnanswered = errors.New("drill: ownership check unanswered")

// runWorker is one worker process (Config.Processes): it reads its
// workerHello from in, runs one replica incarnation (the same worker loop as
// an in-process replica) with its own Locker and Redis client through the
// drill's fault proxy, reaches the drill's job queue and register over in
// and out, and reports every event to it on out. When in closes it stops
// its work, releases what it holds and returns.
func runWorker(ctx context.Context, in io.Reader, out, errOut io.Writer) error {
	dec := json.NewDecoder(in)
	var hello workerHello
	if err := dec.Decode(&hello); err != nil {
		return fmt.Errorf("drill worker: read its settings from stdin (this command is started by `drill --processes`): %w", err)
	}
	// The drill logs each stderr line with its own time: drop ours.
	logger := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	redis.SetLogger(redisLogger{logger})
	cfg := hello.Config
	cfg.Logger = logger
	base, err := baseOptions(cfg.Store)
	if err != nil {
		return err
	}
	client := redis.NewClient(replicaOptions(base, hello.Proxy, cfg))
	defer client.Close()
	st, err := redisstore.New(client, runStoreOptions(hello.Prefix))
	if err != nil {
		return err
	}
	defer st.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wh := newWorkerHost(ctx, hello, out)
	r := &replica{h: wh, cfg: cfg, id: hello.Replica, working: -1, hints: make(chan int, max(cfg.Jobs, 1))}
	ps, err := newProcStore(st, wh, new(proxied).maybeApplied, hello.Late)
	if err != nil {
		return err
	}
	inc := &incarnation{n: hello.Incarnation, crash: make(chan struct{})}
	if err := r.newIncarnation(inc, ps, wh.observer()); err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel()
		wh.readLoop(dec, r.hints)
	})
	r.run(ctx, inc)
	_ = inc.locker.Close() // a worker that is told to stop releases what it holds
	cancel()
	wg.Wait() // the drill closed stdin (or died): the reader is at EOF
	return wh.writeErr()
}

// workerHost is a worker process's host: the drill at the other end of its
// stdin and stdout.
type workerHost struct {
	ctx context.Context
	t0  time.Time // the drill's start, read once from the wall clock

	*lockedRand

	wmu  sync.Mutex
	enc  *json.Encoder
	werr error

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan wire
}

var _ host = (*workerHost)(nil)

func newWorkerHost(ctx context.Context, hello workerHello, out io.Writer) *workerHost {
	// One wall-clock read maps the drill's start onto this process's
	// monotonic clock; every later offset is monotonic.
	now := time.Now()
	t0 := now.Add(-time.Duration(now.UnixNano() - hello.T0))
	seed := hello.Config.Seed
	if seed != 0 {
		seed ^= uint64(hello.Replica)<<32 ^ uint64(hello.Incarnation)<<48
	}
	return &workerHost{ctx: ctx, t0: t0, enc: json.NewEncoder(out), pending: make(map[uint64]chan wire),
		lockedRand: newRand(seed)}
}

func (w *workerHost) writeErr() error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	return w.werr
}

// send writes one message; after a failed write (the drill is gone) it
// drops the rest.
func (w *workerHost) send(m wire) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.werr == nil {
		if err := w.enc.Encode(m); err != nil {
			w.werr = fmt.Errorf("drill worker: write to the drill: %w", err)
		}
	}
}

// stopping is the reply to every request once the worker stops: no job
// left, the job done, the write accepted; the loop then ends.
var stopping = wire{Job: -1, OK: true}

// call sends m and, unless it is a notice, waits for its reply (stopping
// when the worker stops first).
func (w *workerHost) call(m wire) wire {
	if notices[m.K] {
		w.send(m)
		return wire{}
	}
	if w.ctx.Err() != nil { // stopping: the drill may have stopped reading
		return stopping
	}
	ch := make(chan wire, 1)
	w.mu.Lock()
	w.next++
	m.ID = w.next
	w.pending[m.ID] = ch
	w.mu.Unlock()
	w.send(m)
	select {
	case r := <-ch:
		return r
	case <-w.ctx.Done():
		w.mu.Lock()
		delete(w.pending, m.ID)
		w.mu.Unlock()
		return stopping
	}
}

// readLoop dispatches the drill's replies and redelivered jobs until stdin
// ends.
func (w *workerHost) readLoop(dec *json.Decoder, hints chan<- int) {
	for {
		var m wire
		if err := dec.Decode(&m); err != nil {
			return
		}
		switch m.K {
		case "reply":
			w.mu.Lock()
			ch := w.pending[m.ID]
			delete(w.pending, m.ID)
			w.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case "hint":
			select {
			case hints <- m.Job:
			default:
			}
		}
	}
}

func (w *workerHost) observer() leasehold.Observer {
	return leasehold.ObserverFunc(func(e leasehold.Event) { w.send(wire{K: "event", Event: toWireEvent(e)}) })
}

func (w *workerHost) since() time.Duration { return time.Since(w.t0) }
