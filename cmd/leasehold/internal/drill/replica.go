package drill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// replica is one worker process. It runs as a series of incarnations: a
// crash ends one and, after 2 × TTL, the next starts with a fresh Locker,
// as a restarted pod would. In-process, its worker loop runs here against
// the incarnation's session (h); with Config.Processes, the parent keeps one
// replica per child as the injector's handle (its working job and pause
// request) and the child runs the same loop against a workerHost.
type replica struct {
	h     host
	cfg   Config
	id    int
	hints chan int // jobs redelivered to this replica: taken with a blocking Acquire

	mu      sync.Mutex
	inc     *incarnation
	working int // the job in its work phase under a store lease, or -1
}

// incarnation is one process lifetime of a replica: in-process, a Locker
// over its own procStore; with Config.Processes, in the parent, a child
// process and, in the child, its Locker. Its process is what a pause
// freezes and a crash kills: the procStore in-process (its store calls
// block or fail), the child process (SIGSTOP, SIGCONT, SIGKILL).
type incarnation struct {
	n      int
	locker *leasehold.Locker
	proc   process
	crash  chan struct{} // closed when the process dies
	once   sync.Once
}

// process is what the pause and crash faults act on.
type process interface {
	freeze()
	thaw()
	// paused returns a channel closed when the pause ends (nil: not
	// paused) and one closed when the process is gone (nil: never).
	paused() (frozen, gone <-chan struct{})
	kill()
}

var (
	_ process = (*procStore)(nil)
	_ process = (*child)(nil)
)

type pauseEvent struct {
	replica, job int
	at           time.Duration // when the pause began
}

// outcome of one attempt at a job.
type outcome int

const (
	outContended outcome = iota
	outStoreError
	outDone
	outFailed
	outCrashed
)

func (r *replica) current() *incarnation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inc
}

// supervise runs r's in-process incarnations until ctx ends, then closes
// their lockers.
func (d *drill) supervise(ctx context.Context, r *replica) {
	var (
		lockers []*leasehold.Locker
		closers []func()
	)
	defer func() {
		for _, l := range lockers {
			_ = l.Close()
		}
		for _, c := range closers {
			c()
		}
	}()
	r.markWorking(-1, false)
	for n := 0; ctx.Err() == nil; n++ {
		st, closeStore, err := d.be.open(r.id)
		if err != nil { // a client cannot be built (etcd with credentials: cannot log in)
			d.fail(err)
			return
		}
		closeStore = sync.OnceFunc(closeStore)
		closers = append(closers, closeStore)
		inc := &incarnation{n: n, crash: make(chan struct{})}
		r.h = d.newSession(ctx, r, inc)
		ps, err := newProcStore(st, r.h, d.be.maybeApplied, d.be.lateness())
		if err != nil {
			d.fail(err)
			return
		}
		if err := r.newIncarnation(inc, ps, d.observer()); err != nil { // options were validated by WithDefaults
			panic(err)
		}
		lockers = append(lockers, inc.locker)
		if d.cfg.Workload == WorkloadJobs {
			r.run(ctx, inc)
		} else {
			d.runGroup(ctx, r, inc)
		}
		if ctx.Err() != nil {
			return
		}
		// A dead process's connections close. Its Locker is closed at the
		// end; its store calls fail fast meanwhile.
		closeStore()
		if !sleep(ctx, 2*d.cfg.TTL) { // the process restarts
			return
		}
	}
}

// newIncarnation starts incarnation inc of r: a Locker named replica-N over
// ps, reporting to obs.
func (r *replica) newIncarnation(inc *incarnation, ps *procStore, obs leasehold.Observer) error {
	l, err := leasehold.New(ps.forLocker(), r.cfg.lockerOptions(replicaName(r.id), obs))
	if err != nil {
		return err
	}
	inc.locker, inc.proc = l, ps
	r.mu.Lock()
	r.inc = inc
	r.mu.Unlock()
	return nil
}

// run runs the incarnation's worker loop and redelivery worker until ctx
// ends or the incarnation dies, and joins them. It does not close the
// Locker: a dead process never releases.
func (r *replica) run(ctx context.Context, inc *incarnation) {
	inc.runAll(ctx, func(ctx context.Context) { r.work(ctx, inc) },
		func(ctx context.Context) { r.redeliveries(ctx, inc) })
}

// runAll runs each of fs in a goroutine of its own until ctx ends or the
// incarnation dies (then their context ends), and joins them.
func (inc *incarnation) runAll(ctx context.Context, fs ...func(context.Context)) {
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Go(func() { f(ictx) })
	}
	select {
	case <-ctx.Done():
	case <-inc.crash:
	}
	cancel()
	wg.Wait()
}

// die crashes the current incarnation: its store calls fail from now on
// and its goroutines stop without releasing anything.
func (inc *incarnation) die() {
	inc.once.Do(func() {
		inc.proc.kill()
		close(inc.crash)
	})
}

func (inc *incarnation) dead() bool {
	select {
	case <-inc.crash:
		return true
	default:
		return false
	}
}

// work is the main worker loop: pick a job that is not done, try its lease.
func (r *replica) work(ctx context.Context, inc *incarnation) {
	for ctx.Err() == nil && !inc.dead() {
		m := r.h.call(wire{K: "pick"})
		backoff := 10 * time.Millisecond // waiting for the next job to arrive
		switch {
		case m.Job < 0 && m.OK: // every job is done
			return
		case m.Job >= 0:
			backoff = r.backoff(r.process(ctx, inc, m.Job, false))
		}
		if backoff < 0 || !sleep(ctx, backoff) { // a crash ends ctx too
			return
		}
	}
}

// backoff returns how long to wait after an attempt, or -1 to stop.
func (r *replica) backoff(o outcome) time.Duration {
	switch o {
	case outContended:
		return 5*time.Millisecond + r.h.randN(10*time.Millisecond)
	case outStoreError, outFailed:
		return 25*time.Millisecond + r.h.randN(25*time.Millisecond)
	case outCrashed:
		return -1
	}
	return 0
}

// redeliveries takes jobs handed to this replica after their holder stopped
// (as a queue redelivers a message) and waits for their lease.
func (r *replica) redeliveries(ctx context.Context, inc *incarnation) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-inc.crash:
			return
		case job := <-r.hints:
			if !r.h.call(wire{K: "done", Job: job}).OK && r.process(ctx, inc, job, true) == outCrashed {
				return
			}
		}
	}
}

// process makes one attempt at job: lease it, read the register (a done job
// is skipped), work, check ownership, write the result with the lease's
// fence, release.
func (r *replica) process(ctx context.Context, inc *incarnation, job int, wait bool) outcome {
	h, cfg := r.h, r.cfg
	key := jobKey(job)
	var (
		ls  *leasehold.Lease
		err error
	)
	if wait {
		actx, cancel := context.WithTimeout(ctx, 4*cfg.TTL+cfg.WorkMax)
		ls, err = inc.locker.Acquire(actx, key)
		cancel()
	} else {
		ls, err = inc.locker.TryAcquire(ctx, key)
	}
	switch {
	case err == nil:
	case errors.Is(err, leasehold.ErrNotAcquired):
		return outContended
	default:
		return outStoreError
	}
	sec := Section{Replica: r.id, Incarnation: inc.n, Job: job, Key: key, Token: ls.Token(), Fence: ls.Fence(),
		Degraded: ls.Degraded(), Takeover: wait, Start: h.since()}
	id := h.call(wire{K: "open", Section: &sec, Token: sec.Token}).Sec
	sec.ID = id
	finish := func(o string, worked bool) { r.endSection(id, o, worked) }
	release := func() { _ = ls.Release(context.WithoutCancel(ctx)) }

	if h.call(wire{K: "read", Job: job, Sec: id}).OK {
		release()
		finish("already done", false)
		return outDone
	}
	r.setWorking(job, !ls.Degraded())
	defer r.setWorking(-1, false)

	t := time.NewTimer(cfg.WorkMin + h.randN(cfg.WorkMax-cfg.WorkMin))
	select {
	case <-t.C:
	case <-ls.Done():
		t.Stop()
		release()
		finish(causeName(ls.Err()), false)
		return outFailed
	case <-inc.crash:
		t.Stop()
		r.crashed(key, ls.Token(), id, false)
		return outCrashed
	case <-ctx.Done():
		t.Stop()
		release()
		finish("stopped", false)
		return outFailed
	}
	if err := ls.Err(); err != nil { // the last ownership check before the write
		release()
		finish(causeName(err), false)
		return outFailed
	}
	r.checkBelief(ls, &sec)
	h.call(wire{K: "prewrite", Job: job, Sec: id, Key: key, Token: ls.Token()})
	if inc.dead() {
		finish("crashed", false)
		return outCrashed
	}
	value := fmt.Sprintf("r%d/s%d", r.id, id)
	ok := h.call(wire{K: "write", Job: job, Sec: id, Fence: ls.Fence(), Value: value}).OK
	release()
	if ok {
		finish("written", true)
		return outDone
	}
	finish("write rejected", true)
	return outFailed
}

func causeName(err error) string {
	switch {
	case err == nil:
		return "released"
	case errors.Is(err, leasehold.ErrLeaseLost):
		return "lost"
	case errors.Is(err, leasehold.ErrLeaseAbandoned):
		return "abandoned"
	case errors.Is(err, leasehold.ErrLeaseExpired):
		return "expired"
	case errors.Is(err, leasehold.ErrLockerClosed):
		return "closed"
	}
	return err.Error()
}

// setWorking tells the drill the job r works on under a store lease
// (fenced), or -1.
func (r *replica) setWorking(job int, fenced bool) { r.h.call(wire{K: "work", Job: job, OK: fenced}) }

// markWorking records it for the injector.
func (r *replica) markWorking(job int, fenced bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fenced || job < 0 {
		r.working = job
	}
}

// endSection ends section id now with outcome.
func (r *replica) endSection(id int, outcome string, worked bool) {
	r.h.call(wire{K: "end", Sec: id, At: r.h.since(), Text: outcome, OK: worked})
}

// crashed records that the holder of key died holding section id.
func (r *replica) crashed(key, token string, id int, worked bool) {
	at := r.h.since()
	r.h.call(wire{K: "stop", Stop: &Stop{Fault: FaultCrash, Key: key, At: at}, Token: token})
	r.h.call(wire{K: "end", Sec: id, At: at, Text: "crashed", OK: worked})
}

// checkBelief asks the store who holds the lease's key, then checks whether
// the holder still trusts the lease, and reports the outcome.
func (r *replica) checkBelief(ls *leasehold.Lease, sec *Section) {
	if ls.Degraded() {
		return
	}
	m := r.h.call(wire{K: "inspect", Key: ls.Key()})
	var (
		info driver.LockInfo
		err  error
	)
	switch {
	case !m.OK:
		err = errUnanswered
	case !m.Flag:
		err = leasehold.ErrNotHeld
	default:
		info = driver.LockInfo{Key: ls.Key(), Token: m.Token, Fence: m.Fence}
	}
	b := judgeBelief(ls, sec, info, err, r.h.since())
	r.h.call(wire{K: "belief", Belief: &b})
}

// busyJob returns the job the replica is working on under a store lease, or -1.
func (r *replica) busyJob() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.working
}

// pauseRequest is the injector's request that a holder freeze right before
// its next write: one replica (the jobs workload's victim), or whichever
// holder working under a store lease gets to its write first (the election
// and semaphore workloads, where the holder a fault picks may lose its term
// before its next write and wait behind every other candidate for the
// next). At most one holder takes it.
type pauseRequest struct {
	mu      sync.Mutex
	pending bool
	only    *replica // nil: any holder
}

// set requests a pause of only, or of any holder when only is nil.
func (p *pauseRequest) set(only *replica) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending, p.only = true, only
}

// cancel withdraws the request and reports whether it was still pending
// (false: a holder took it).
func (p *pauseRequest) cancel() (wasPending bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	wasPending = p.pending
	p.pending, p.only = false, nil
	return wasPending
}

// take is r's check right before its write: true when the request is r's
// to take, and then it is taken.
func (p *pauseRequest) take(r *replica) bool {
	busy := r.busyJob() >= 0
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.pending || (p.only != r && (p.only != nil || !busy)) {
		return false
	}
	p.pending, p.only = false, nil
	return true
}

// pause freezes the whole process right before its write: every store call
// of this incarnation (its renewals too) waits until the injector thaws it.
func (d *drill) pause(ctx context.Context, r *replica, inc *incarnation, job int, key, token string, id int) {
	inc.proc.freeze()
	at := d.rec.since()
	d.rec.section(id, func(s *Section) { s.PauseStart = at })
	d.rec.stop(Stop{Fault: FaultPause, Replica: r.id, Key: key, Token: token, At: at})
	select {
	case d.pauses <- pauseEvent{replica: r.id, job: job, at: at}:
	case <-ctx.Done():
	}
	if frozen, gone := inc.proc.paused(); frozen != nil {
		select {
		case <-frozen:
		case <-gone:
		case <-ctx.Done():
			inc.proc.thaw()
		}
	}
	end := d.rec.since()
	d.rec.section(id, func(s *Section) { s.PauseEnd = end })
}
