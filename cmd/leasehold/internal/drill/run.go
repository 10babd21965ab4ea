package drill

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/etcdproc"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/fence"
)

// keyPrefix is the prefix of every lock key a drill takes.
const keyPrefix = "drill/job/"

func jobKey(job int) string { return fmt.Sprintf("%s%03d", keyPrefix, job) }

// Run runs one drill with cfg and returns its report: on a fresh embedded
// memory store, or on Redis or etcd (Config.Store) through a fault proxy. It returns
// an error only when the drill could not run: bad configuration
// (ErrInvalidConfig) or a store it could not reach or start (ErrSetup); a
// failed invariant is a Report whose Passed is false. Run stops every
// goroutine and process it started before it returns; on Redis and etcd it
// deletes the run's keys (they carry a prefix unique to the run).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	d := newDrill(cfg)
	if cfg.Register != "" && cfg.Register != "memory" {
		ext, err := openRegister(ctx, cfg.Register, d.observer())
		if err != nil {
			return nil, err
		}
		defer ext.close()
		d.reg = ext
	}
	switch k := cfg.kind(); {
	case k.etcd():
		// A restart keeps etcd's leases and extends them by the election
		// timeout: from then on, each lock may live that long plus its TTL.
		d.be, err = newEtcdBackend(ctx, cfg, func() { d.rec.revive(etcdproc.ElectionMs * time.Millisecond) })
	case k.redis():
		d.be, err = newRedisBackend(ctx, cfg)
	case k.postgres():
		d.be, err = newPgBackend(ctx, cfg)
	default:
		d.be = newMemBackend(d.float, cfg.TTL)
	}
	if err != nil {
		return nil, err
	}
	defer d.be.close()
	d.run(ctx)
	if err := d.failure(); err != nil {
		return nil, err
	}
	h := d.rec.snapshot()
	d.progress("done (%s); checking the history", d.activity())
	return Check(cfg, h), nil
}

// drill is one run: the shared store and register, the replicas, the
// injector and the recorder.
type drill struct {
	cfg Config
	be  backend
	reg register
	rec *recorder

	*lockedRand

	done      []atomic.Bool
	doneCount atomic.Int64
	allDone   chan struct{}
	doneOnce  sync.Once

	replicas []*replica
	pauseReq pauseRequest
	pauses   chan pauseEvent

	// Jobs arrive at a steady rate over the planned fault schedule, so every
	// fault lands on a working system; when the injector is done, the rest
	// arrive at once.
	arrival  time.Duration
	injected atomic.Bool
	// restarting is set while the restart or failover fault runs.
	restarting atomic.Bool
	// cutOff is the replica the partition fault has cut off, if any.
	cutOff partitionState

	// abort ends the workload early; failed is why (a worker process that
	// could not start or died on its own).
	abort  context.CancelFunc
	failMu sync.Mutex
	failed error
}

// fail records the first error that makes the drill unable to run and ends
// the workload.
func (d *drill) fail(err error) {
	d.failMu.Lock()
	if d.failed == nil {
		d.failed = err
	}
	d.failMu.Unlock()
	d.abort()
}

func (d *drill) failure() error {
	d.failMu.Lock()
	defer d.failMu.Unlock()
	return d.failed
}

// observer records every event in the history and forwards it to
// Config.Observer.
func (d *drill) observer() leasehold.Observer {
	extra := d.cfg.Observer
	return leasehold.ObserverFunc(func(e leasehold.Event) {
		d.rec.event(e.Kind.String())
		d.cutOff.observe(e, d.rec.since)
		if extra != nil {
			extra.Observe(e)
		}
	})
}

func newDrill(cfg Config) *drill {
	d := &drill{
		cfg:        cfg,
		rec:        newRecorder(),
		lockedRand: newRand(cfg.Seed),
		done:       make([]atomic.Bool, cfg.Jobs),
		allDone:    make(chan struct{}),
		pauses:     make(chan pauseEvent, 1),
	}
	obs := d.observer()
	if cfg.NoFencing {
		d.reg = &unfencedRegister{}
	} else {
		d.reg = fence.NewRegister(fence.RegisterOptions{Name: "drill", Resource: "register", Observer: obs})
	}
	d.arrival = cfg.plannedSchedule() / time.Duration(cfg.Jobs)
	for i := range cfg.Replicas {
		d.replicas = append(d.replicas, &replica{cfg: cfg, id: i, working: -1, hints: make(chan int, cfg.Jobs)})
	}
	return d
}

// lockedRand is a random source safe for concurrent use.
type lockedRand struct {
	mu  sync.Mutex
	rng *rand.Rand
}

// newRand seeds a source with seed, or with the time when seed is 0.
func newRand(seed uint64) *lockedRand {
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	return &lockedRand{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (l *lockedRand) randN(n time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Duration(l.rng.Int64N(int64(n)))
}

func (l *lockedRand) intN(n int) int { return int(l.randN(time.Duration(n))) }

func (l *lockedRand) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.Float64()
}

// run runs the workload, the injector and the stuck-lock sampler until every
// job is done or the time limit, and joins them.
func (d *drill) run(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, d.cfg.TimeLimit)
	defer cancel()
	d.abort = cancel
	work, stopWork := context.WithCancel(ctx)
	defer stopWork()

	var wg sync.WaitGroup
	for _, r := range d.replicas {
		if d.cfg.Processes {
			wg.Go(func() { d.superviseProcesses(work, r) })
		} else {
			wg.Go(func() { d.supervise(work, r) })
		}
	}
	d.progress("%d replicas working on %d jobs (TTL %v); faults: %v", len(d.replicas), d.cfg.Jobs, d.cfg.TTL, d.cfg.Faults)
	injCtx, stopInj := context.WithCancel(work)
	var injWG sync.WaitGroup
	injDone := make(chan struct{})
	injWG.Go(func() {
		defer close(injDone)
		d.inject(injCtx)
		if d.cfg.Workload != WorkloadJobs { // a few quiet terms, then stop
			sleep(injCtx, 4*d.cfg.TTL)
			d.doneOnce.Do(func() { close(d.allDone) })
		}
	})
	sampCtx, stopSamp := context.WithCancel(context.Background())
	var sampWG sync.WaitGroup
	sampWG.Go(func() { d.sample(sampCtx) })

	select {
	case <-d.allDone:
	case <-ctx.Done():
	}
	d.rec.count(func(h *History) { h.Duration = d.rec.since() })
	select { // every planned fault is injected, also when the jobs were done first (a long pause)
	case <-injDone:
	case <-ctx.Done():
	}
	stopInj()
	injWG.Wait() // the injector heals the store and thaws paused replicas
	stopWork()
	wg.Wait()
	// Let the leases left in the store by crashed or failed holders expire
	// under the sampler's eye, so a stuck lock is seen.
	t := time.NewTimer(d.be.expiryBound() + 50*time.Millisecond)
	select {
	case <-t.C:
	case <-parent.Done():
		t.Stop()
	}
	stopSamp()
	sampWG.Wait()
	d.finalProbe(parent)
	d.rec.count(func(h *History) {
		h.Jobs = d.cfg.Jobs
		h.Done = int(d.doneCount.Load())
	})
}

func (d *drill) markDone(job int) {
	if d.cfg.Workload != WorkloadJobs { // no job is ever done: the run ends with the faults
		return
	}
	if d.done[job].CompareAndSwap(false, true) {
		if int(d.doneCount.Add(1)) == d.cfg.Jobs {
			d.doneOnce.Do(func() { close(d.allDone) })
		}
	}
}

// available returns how many jobs have arrived.
func (d *drill) available() int {
	if d.injected.Load() || d.arrival <= 0 {
		return d.cfg.Jobs
	}
	return min(d.cfg.Jobs, 1+int(d.rec.since()/d.arrival))
}

// pickJob returns a random job that has arrived and is not known to be
// done, or -1; finished when every job is done.
func (d *drill) pickJob() (job int, finished bool) {
	if int(d.doneCount.Load()) == d.cfg.Jobs {
		return -1, true
	}
	var open []int
	for i := range d.available() {
		if !d.done[i].Load() {
			open = append(open, i)
		}
	}
	if len(open) == 0 {
		return -1, false
	}
	return open[d.intN(len(open))], false
}

func (d *drill) op(o Op) { d.rec.count(func(h *History) { h.Ops = append(h.Ops, o) }) }

func (d *drill) read(client, job, section int) (value string, found bool) {
	call := d.rec.since()
	v, f, ok := d.reg.Read(jobKey(job))
	d.op(Op{Client: client, Job: job, Section: section, Fence: f, Value: string(v), Found: ok, Call: call,
		Return: d.rec.since()})
	if ok {
		d.markDone(job)
	}
	return string(v), ok
}

func (d *drill) write(client, job, section int, f uint64, value string) bool {
	call := d.rec.since()
	err := d.reg.Write(context.Background(), jobKey(job), f, []byte(value))
	o := Op{Client: client, Job: job, Section: section, Write: true, Fence: f, Value: value, Accepted: err == nil, Call: call, Return: d.rec.since()}
	if err != nil && !errors.Is(err, fence.ErrStaleFence) {
		o.Err = err.Error()
	}
	d.op(o)
	if err == nil {
		d.markDone(job)
	}
	return err == nil
}

// sample lists the store's locks every few milliseconds and reports a lock
// still present more than TTL after its holder's last applied acquire or
// renew, or after the key's last release (which may have granted it to its
// holder): a lock stuck beyond its TTL.
func (d *drill) sample(ctx context.Context) {
	slack := 15 * time.Millisecond
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A lock listed was live at some instant after now: now, not the
		// time List returns, is the conservative moment to compare with.
		now := d.rec.since()
		lctx, cancel := context.WithTimeout(ctx, d.be.observeTimeout())
		locks, err := d.groupLocks(lctx)
		cancel()
		if err != nil || d.restarting.Load() {
			continue
		}
		for _, l := range locks {
			last, busy, known := d.rec.lastApplied(l.Token)
			// A release of the key may have granted it to this token's
			// waiter (grant on release), with a fresh TTL and no call of
			// this token.
			last = max(last, d.rec.lastRevival(), d.rec.lastGrant(l.Key))
			if busy || !known || now-last <= d.be.expiryBound()+slack {
				continue
			}
			d.rec.stuck(l.Key, now, fmt.Sprintf("lock still held %v after its last applied acquire/renew or the key's last release (TTL %v, "+
				"store expiry within %v)", (now-last).Round(time.Millisecond), d.cfg.TTL, d.be.expiryBound()))
		}
	}
}

// beliefCheck is the outcome of one ownership check right before a write.
type beliefCheck struct {
	Unchecked bool          `json:"unchecked,omitempty"` // the store did not answer
	Violation bool          `json:"violation,omitempty"` // trusted while the store said otherwise
	At        time.Duration `json:"at"`
	Key       string        `json:"key"`
	Replica   int           `json:"replica"`
	Fence     uint64        `json:"fence"`
	ValidFor  time.Duration `json:"valid_for"`
	Holder    string        `json:"holder,omitempty"`
	SecStart  time.Duration `json:"sec_start"`
}

// judgeBelief compares the store's answer (info, err from Inspect) with the
// lease as its holder sees it now (at): a violation when the holder still
// trusts it (Err nil, before ValidUntil) while the store names another
// holder or none.
func judgeBelief(ls *leasehold.Lease, sec *Section, info driver.LockInfo, err error, at time.Duration) beliefCheck {
	now := time.Now()
	b := beliefCheck{At: at, Key: ls.Key(), Replica: sec.Replica, Fence: ls.Fence(), SecStart: sec.Start}
	if err != nil && !errors.Is(err, leasehold.ErrNotHeld) {
		b.Unchecked = true
		return b
	}
	if ls.Err() != nil || !now.Before(ls.ValidUntil()) || (err == nil && info.Token == ls.Token()) {
		return b
	}
	b.Violation, b.ValidFor, b.Holder = true, ls.ValidUntil().Sub(now), "nobody"
	if err == nil {
		b.Holder = fmt.Sprintf("another token (fence %d)", info.Fence)
	}
	return b
}

// recordBelief counts an ownership check and records a violation, unless
// the store lost its data since the lease began (expected until the next
// renewal).
func (d *drill) recordBelief(b beliefCheck) {
	d.rec.count(func(h *History) {
		h.BeliefChecks++
		if b.Unchecked {
			h.BeliefUnchecked++
		}
	})
	if !b.Violation {
		return
	}
	if d.rec.restartedSince(b.SecStart) {
		d.rec.count(func(h *History) { h.BeliefsAfterRestart++ })
		return
	}
	list := &d.rec.h.Beliefs
	if d.rec.inFailover(b.At) {
		list = &d.rec.h.FailoverBeliefs
	}
	d.rec.anomaly(list, Anomaly{At: b.At, Key: b.Key,
		Detail: fmt.Sprintf("replica %d trusted its lease (fence %d, valid %v more) while the store said %s holds it", b.Replica, b.Fence, b.ValidFor.Round(time.Millisecond), b.Holder)})
}

// finalProbe lists the locks once every replica has stopped and TTL has
// passed: every key must be free by then (each holder released or stopped
// renewing at least a TTL ago), lost acquire and release replies included.
func (d *drill) finalProbe(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 5*d.be.observeTimeout())
	locks, err := d.groupLocks(lctx)
	cancel()
	if err != nil {
		return
	}
	now := d.rec.since()
	for _, l := range locks {
		d.rec.stuck(l.Key, now, fmt.Sprintf("lock still held (fence %d, %v left) more than %v after every replica "+
			"stopped (TTL %v)", l.Fence, l.Remaining.Round(time.Millisecond), d.be.expiryBound(), d.cfg.TTL))
	}
}
