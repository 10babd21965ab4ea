package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	ps, err := newProcStore(st, wh, r.id, new(proxied).maybeApplied, hello.Late)
	if err != nil {
		return err
	}
	inc, err := r.newIncarnation(hello.Incarnation, ps, wh.observer())
	if err != nil {
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

	rngMu sync.Mutex
	rng   *rand.Rand

	wmu  sync.Mutex
	enc  *json.Encoder
	werr error

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan wire
}

var (
	_ host         = (*workerHost)(nil)
	_ callRecorder = (*workerHost)(nil)
)

func newWorkerHost(ctx context.Context, hello workerHello, out io.Writer) *workerHost {
	// One wall-clock read maps the drill's start onto this process's
	// monotonic clock; every later offset is monotonic.
	now := time.Now()
	t0 := now.Add(-time.Duration(now.UnixNano() - hello.T0))
	seed := hello.Config.Seed ^ uint64(hello.Replica)<<32 ^ uint64(hello.Incarnation)<<48
	if hello.Config.Seed == 0 {
		seed = uint64(now.UnixNano())
	}
	return &workerHost{
		ctx: ctx, t0: t0, enc: json.NewEncoder(out), pending: make(map[uint64]chan wire),
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
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

// call sends a request and waits for its reply; false when the worker
// stops first.
func (w *workerHost) call(m wire) (wire, bool) {
	if w.ctx.Err() != nil { // stopping: the drill may have stopped reading
		return wire{}, false
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
		return r, true
	case <-w.ctx.Done():
		w.mu.Lock()
		delete(w.pending, m.ID)
		w.mu.Unlock()
		return wire{}, false
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

func (w *workerHost) randN(n time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return time.Duration(w.rng.Int64N(int64(n)))
}

func (w *workerHost) pickJob() (int, bool) {
	r, ok := w.call(wire{K: "pick"})
	if !ok {
		return -1, true
	}
	return r.Job, r.OK
}

func (w *workerHost) isDone(job int) bool {
	r, ok := w.call(wire{K: "done", Job: job})
	return !ok || r.OK
}

func (w *workerHost) read(_, job, section int) (string, bool) {
	r, _ := w.call(wire{K: "read", Job: job, Sec: section})
	return r.Value, r.OK
}

func (w *workerHost) write(_, job, section int, fence uint64, value string) bool {
	r, _ := w.call(wire{K: "write", Job: job, Sec: section, Fence: fence, Value: value})
	return r.OK
}

func (w *workerHost) openSection(s Section) int {
	r, ok := w.call(wire{K: "open", Section: &s, Token: s.Token})
	if !ok {
		return -1
	}
	return r.Sec
}

func (w *workerHost) endSection(id int, end time.Duration, outcome string, worked bool) {
	w.send(wire{K: "end", Sec: id, At: end, Text: outcome, OK: worked})
}

func (w *workerHost) stop(s Stop) { w.send(wire{K: "stop", Stop: &s, Token: s.Token}) }

func (w *workerHost) checkBelief(_ context.Context, ls *leasehold.Lease, sec *Section) {
	if ls.Degraded() {
		return
	}
	r, ok := w.call(wire{K: "inspect", Key: ls.Key()})
	if !ok {
		return
	}
	var (
		info leasehold.LockInfo
		err  error
	)
	switch {
	case !r.OK:
		err = errUnanswered
	case !r.Flag:
		err = leasehold.ErrNotHeld
	default:
		info = leasehold.LockInfo{Key: ls.Key(), Token: r.Token, Fence: r.Fence}
	}
	b := judgeBelief(ls, sec, info, err, w.since())
	w.send(wire{K: "belief", Belief: &b})
}

func (w *workerHost) working(_, job int, fenced bool) { w.send(wire{K: "work", Job: job, OK: fenced}) }

// beforeWrite asks the drill whether it may write; the drill answers at
// once, or SIGSTOPs this process first and answers after its SIGCONT.
func (w *workerHost) beforeWrite(_ context.Context, _ *replica, _ *incarnation, job int, key, token string,
	section int) {
	w.call(wire{K: "prewrite", Job: job, Sec: section, Key: key, Token: token})
}

func (w *workerHost) begin(token string) time.Duration {
	at := w.since()
	w.send(wire{K: "begin", Token: token, At: at})
	return at
}

func (w *workerHost) end(token string, call time.Duration, applied bool, late time.Duration) {
	w.send(wire{K: "ret", Token: token, Call: call, At: w.since(), OK: applied, Late: late})
}

func (w *workerHost) acquired(a Acquisition) {
	w.send(wire{K: "acq", Key: a.Key, Token: a.Token, Fence: a.Fence, At: a.At})
}
