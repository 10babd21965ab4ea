package drill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// inject injects the configured faults one after another, 2 × TTL apart
// (the system recovers in between), and heals everything it broke before it
// returns.
func (d *drill) inject(ctx context.Context) {
	defer func() {
		d.injected.Store(true)
		d.be.heal()
		d.pauseReq.cancel()
		for _, r := range d.replicas {
			if inc := r.current(); inc != nil {
				inc.proc.thaw()
			}
		}
	}()
	if !sleep(ctx, d.cfg.gap()) {
		return
	}
	for _, f := range d.cfg.Faults {
		start := d.rec.since()
		d.progress("fault %s starts (%s)", f, d.activity())
		note := d.injectOne(ctx, f)
		w := Window{Fault: f, Start: start, End: d.rec.since(), Note: note, Skipped: strings.HasPrefix(note, "skipped")}
		d.rec.count(func(h *History) { h.Windows = append(h.Windows, w) })
		d.progress("fault %s ended after %v: %s (%s)", f, (d.rec.since() - start).Round(time.Millisecond), note, d.activity())
		if !sleep(ctx, d.cfg.gap()) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (d *drill) injectOne(ctx context.Context, f Fault) string {
	c, proxied := d.cfg, d.cfg.kind().viaProxy()
	switch f {
	case FaultOutage:
		d.hold(ctx, c.Outage, func() { d.be.setDown(true) }, func() { d.be.setDown(false) })
		if proxied {
			return fmt.Sprintf("fault proxy down for %v: connections cut and refused", c.Outage)
		}
		return fmt.Sprintf("store down for %v", c.Outage)
	case FaultLatency:
		d.hold(ctx, c.Window, func() { d.be.setLatency(c.Latency) }, func() { d.be.setLatency(0) })
		if c.kind().etcd() {
			return fmt.Sprintf("fault proxy holds every chunk %v each way (renew timeout and etcd request "+
				"timeout %v)", c.Latency, c.renewTimeout())
		}
		if proxied {
			return fmt.Sprintf("fault proxy holds every chunk %v each way (renew timeout %v, client timeout %v)",
				c.Latency, c.renewTimeout(), c.clientTimeout())
		}
		return fmt.Sprintf("+%v per store call (renew timeout %v)", c.Latency, c.renewTimeout())
	case FaultLostReply:
		d.hold(ctx, c.Window, func() { d.be.dropReplies(c.DropRate) }, func() { d.be.dropReplies(0) })
		if proxied {
			return fmt.Sprintf("fault proxy forwards requests and drops %.0f%% of replies (a connection that "+
				"lost one loses the rest until it is cut)", 100*c.DropRate)
		}
		return fmt.Sprintf("%.0f%% of acquire/renew/release replies dropped after the store applied them",
			100*c.DropRate)
	case FaultRestart:
		return d.injectRestart()
	case FaultPause:
		return d.injectPause(ctx)
	case FaultCrash:
		return d.injectCrash(ctx)
	case FaultFailover:
		return d.injectFailover(ctx)
	case FaultPartition:
		return d.injectPartition(ctx)
	case FaultEvict:
		return d.injectEvict(ctx)
	}
	return "unknown fault"
}

// hold turns a store fault on for d (or until ctx ends), then off.
func (d *drill) hold(ctx context.Context, dur time.Duration, on, off func()) {
	on()
	sleep(ctx, dur)
	off()
}

// injectRestart restarts the store. While it restarts nothing expires, and
// etcd extends every lease when it is back (recorded when restart returns):
// the sampler does not judge a lock it sees meanwhile.
func (d *drill) injectRestart() string {
	d.restarting.Store(true)
	err := d.be.restart(func() { d.rec.count(func(h *History) { h.Restarts = append(h.Restarts, d.rec.since()) }) })
	d.restarting.Store(false)
	if err != nil {
		return failedNote("restart", err)
	}
	if n, ok := d.be.(interface{ restartNote() string }); ok {
		return n.restartNote()
	}
	return "store restarted: every lock and fence counter lost"
}

// failedNote is the note of a fault that could not be injected: "skipped:
// why" (errRestartSkipped) or what failed.
func failedNote(what string, err error) string {
	if errors.Is(err, errRestartSkipped) {
		return "skipped: " + strings.TrimPrefix(err.Error(), errRestartSkipped.Error()+": ")
	}
	return fmt.Sprintf("%s failed: %v", what, err)
}

// failoverer is a backend that can fail its master over to a replica.
type failoverer interface {
	failover(ctx context.Context, mark func()) (string, error)
}

// injectFailover fails the store's master over while replicas hold and
// wait. The history records the failover from its request to the
// sentinels' agreement; meanwhile the sampler does not judge the locks it
// lists (the observer may still talk to the old master).
func (d *drill) injectFailover(ctx context.Context) string {
	f, ok := d.be.(failoverer)
	if !ok {
		return "skipped: this store has no replicas to fail over to"
	}
	d.restarting.Store(true)
	defer d.restarting.Store(false)
	idx := -1
	note, err := f.failover(ctx, func() { idx = d.rec.failoverStart() })
	if idx >= 0 {
		d.rec.failoverEnd(idx)
	}
	if err != nil {
		return failedNote("failover", err)
	}
	return note
}

// victim waits for a replica working on a job under a store lease, other
// than except, and returns it with its job.
func (d *drill) victim(ctx context.Context, except int) (*replica, int) {
	deadline := time.Now().Add(5*d.cfg.WorkMax + 5*d.cfg.TTL)
	for time.Now().Before(deadline) {
		start := d.intN(len(d.replicas))
		for i := range d.replicas {
			r := d.replicas[(start+i)%len(d.replicas)]
			if r.id == except {
				continue
			}
			if inc := r.current(); inc == nil || inc.dead() {
				continue
			}
			if job := r.busyJob(); job >= 0 {
				return r, job
			}
		}
		if !sleep(ctx, 2*time.Millisecond) {
			break
		}
	}
	return nil, -1
}

// redeliver hands job to a live replica other than from, as a queue
// redelivers a message whose consumer went silent.
func (d *drill) redeliver(job, from int) {
	for i := 1; i < len(d.replicas); i++ {
		r := d.replicas[(from+i)%len(d.replicas)]
		if inc := r.current(); inc != nil && !inc.dead() {
			select {
			case r.hints <- job:
			default:
			}
			return
		}
	}
}

// injectPause freezes a holder right before its write (pauseHolder), hands
// its job to another replica, waits until that one has written it (or a
// cap), then thaws the paused one, which writes with its old fence.
func (d *drill) injectPause(ctx context.Context) string {
	r, ev, note := d.pauseHolder(ctx)
	if r == nil {
		return note
	}
	start := time.Now()
	d.redeliver(ev.job, ev.replica)
	limit := 10*d.cfg.TTL + 2*d.cfg.WorkMax
	for !d.takenOver(ev) || time.Since(start) < 3*d.cfg.TTL/2 {
		if time.Since(start) > limit || !sleep(ctx, 2*time.Millisecond) {
			break
		}
	}
	taken := d.takenOver(ev)
	if inc := r.current(); inc != nil {
		inc.proc.thaw()
	}
	how := "paused"
	if d.cfg.Processes {
		how = "SIGSTOPped"
	}
	if d.cfg.Workload != WorkloadJobs {
		return fmt.Sprintf("replica %d %s %v holding %s; taken over meanwhile: %v", ev.replica, how, time.Since(start).Round(time.Millisecond), groupKey, taken)
	}
	if !taken {
		return fmt.Sprintf("replica %d %s %v before writing job %d; nobody took the job over", ev.replica, how, time.Since(start).Round(time.Millisecond), ev.job)
	}
	return fmt.Sprintf("replica %d %s %v before writing job %d, which another replica took over and wrote meanwhile", ev.replica, how, time.Since(start).Round(time.Millisecond), ev.job)
}

// pauseHolder freezes a holder right before its write and returns it with
// the pause; a nil replica with the note when none could be paused (or
// "interrupted" when ctx ended). In the jobs workload it asks a working
// replica, and up to three in turn: one may not reach its write (its lease
// ended, its job was done). In the election and semaphore workloads one
// key passes from holder to holder, and a holder whose term ends before its
// next write queues behind every other candidate, so a request to that one
// holder could wait out its window (and three in a row did on a loaded
// machine); there the next holder to reach its write, whichever it is,
// takes the request: one writes every TTL/4 at most while anyone holds the
// key.
func (d *drill) pauseHolder(ctx context.Context) (*replica, pauseEvent, string) {
	if d.cfg.Workload != WorkloadJobs {
		ev, got, interrupted := d.awaitPause(ctx, nil, 5*d.cfg.WorkMax+5*d.cfg.TTL)
		switch {
		case interrupted:
			return nil, ev, "interrupted"
		case !got:
			return nil, ev, "skipped: no holder reached its write"
		}
		return d.replicas[ev.replica], ev, ""
	}
	why := "skipped: no replica was working"
	for range 3 {
		r, _ := d.victim(ctx, -1)
		if r == nil {
			continue
		}
		ev, got, interrupted := d.awaitPause(ctx, r, 2*d.cfg.WorkMax+d.cfg.TTL)
		switch {
		case interrupted:
			return nil, ev, "interrupted"
		case got:
			return r, ev, ""
		}
		why = "skipped: the replica did not reach its write"
	}
	return nil, pauseEvent{}, why
}

// awaitPause asks only (nil: any holder) to freeze right before its next
// write and waits for it to do so, up to within; got is false when it did
// not reach a write in time.
func (d *drill) awaitPause(ctx context.Context, only *replica, within time.Duration) (ev pauseEvent, got, interrupted bool) {
	d.pauseReq.set(only)
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case ev = <-d.pauses:
		return ev, true, false
	case <-t.C:
		if d.pauseReq.cancel() {
			return ev, false, false
		}
		select { // a holder took the request just now
		case ev = <-d.pauses:
			return ev, true, false
		case <-ctx.Done():
			return ev, false, true
		}
	case <-ctx.Done():
		return ev, false, true
	}
}

// injectCrash kills a working replica mid-job and hands its job to another.
func (d *drill) injectCrash(ctx context.Context) string {
	r, job := d.victim(ctx, -1)
	if r == nil {
		return "skipped: no replica was working"
	}
	inc := r.current()
	inc.die()
	d.redeliver(job, r.id)
	if c, ok := inc.proc.(*child); ok {
		return fmt.Sprintf("replica %d (pid %d) SIGKILLed holding job %d (no release); a new process after %v", r.id, c.cmd.Process.Pid, job, 2*d.cfg.TTL)
	}
	return fmt.Sprintf("replica %d crashed holding job %d (no release); restarts after %v", r.id, job, 2*d.cfg.TTL)
}

// gap is the quiet time before the first fault and after each one.
func (c Config) gap() time.Duration { return 2 * c.TTL }

// plannedSchedule estimates how long injecting c.Faults takes: the window
// over which jobs arrive.
func (c Config) plannedSchedule() time.Duration {
	p := c.gap()
	for _, f := range c.Faults {
		p += c.gap()
		switch f {
		case FaultPause:
			p += 2*c.TTL + c.WorkMax
		case FaultOutage:
			p += c.Outage
		case FaultCrash:
			p += 3 * c.TTL
		case FaultLatency, FaultLostReply:
			p += c.Window
		case FaultFailover:
			p += 2 * time.Second // SENTINEL FAILOVER took 1.2–1.4 s in docs/failover.md
		case FaultPartition:
			p += c.partitionCut() + c.TTL
		case FaultRestart:
			if c.kind() == storeOwnPostgres {
				p += 2 * time.Second // crash and crash recovery took 1.6–2.1 s in docs/drill.md
			}
		}
	}
	return p
}

// progress writes one line to Config.Progress, if set, stamped with the
// drill's clock.
func (d *drill) progress(format string, args ...any) {
	if d.cfg.Progress == nil {
		return
	}
	fmt.Fprintf(d.cfg.Progress, "drill %6.2fs: %s\n", d.rec.since().Seconds(), fmt.Sprintf(format, args...))
}

// activity says what the replicas have done so far: acquisitions and
// fenced writes accepted and rejected.
func (d *drill) activity() string {
	var acq, ok, stale int
	d.rec.count(func(h *History) {
		acq = len(h.Acquisitions)
		ok, stale, _ = writeCounts(h.Ops)
	})
	return fmt.Sprintf("%d replicas: %d acquisitions, %d writes accepted, %d stale writes rejected so far", len(d.replicas), acq, ok, stale)
}
