package drill

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// The election and semaphore workloads (Config.Workload). Every replica
// contends for one key, groupKey, through the same faults as the jobs
// workload. Each leadership term or permit is a Section that spans the time
// its holder trusted it: from Campaign's or Acquire's return until its
// context ended (no later than its ValidUntil), it resigned or released, or
// it crashed. The checker counts the Sections open at any moment.

// groupKey is the one key the election and semaphore workloads contend for.
var groupKey = jobKey(0)

// trustSlack absorbs the recorder's clock reads at the two ends of a term.
const trustSlack = clockSlack

// runGroup runs one incarnation of r in the election or semaphore workload
// until ctx ends or the incarnation crashes.
func (d *drill) runGroup(ctx context.Context, r *replica, inc *incarnation) {
	inc.runAll(ctx, func(ctx context.Context) {
		if d.cfg.Workload == WorkloadElection {
			d.campaign(ctx, r, inc)
		} else {
			d.holdPermits(ctx, r, inc)
		}
	})
}

// campaign takes part in the election on groupKey (Election.Run) until ctx
// ends. A leader ends its term after a random length by cancelling its Run
// (which resigns), then campaigns again.
func (d *drill) campaign(ctx context.Context, r *replica, inc *incarnation) {
	for ctx.Err() == nil && !inc.dead() {
		runCtx, endTerm := context.WithCancel(ctx)
		el, err := leasehold.NewElection(inc.locker, groupKey, leasehold.Callbacks{
			OnStartedLeading: func(lctx context.Context, ls *leasehold.Lease) {
				trust := lctx
				if d.cfg.brokenTrust {
					trust = runCtx // the broken variant: leadership outlives the lease
				}
				d.term(ctx, trust, r, inc, ls, true)
				endTerm()
			},
		})
		if err != nil { // the key is fixed and every drill store is an Inspector
			panic(err)
		}
		_ = el.Run(runCtx)
		endTerm()
	}
}

// holdPermits takes a permit of groupKey's semaphore (waiting in its queue),
// holds it for a random time and releases it, until ctx ends.
func (d *drill) holdPermits(ctx context.Context, r *replica, inc *incarnation) {
	sem, err := inc.locker.Semaphore(groupKey, d.cfg.Permits)
	if err != nil { // the key is fixed and Config checked the limit
		panic(err)
	}
	for ctx.Err() == nil && !inc.dead() {
		actx, cancel := context.WithTimeout(ctx, 4*d.cfg.TTL+d.cfg.WorkMax)
		ls, err := sem.Acquire(actx)
		cancel()
		if err != nil {
			sleep(ctx, 25*time.Millisecond+d.randN(25*time.Millisecond))
			continue
		}
		trust := ls.Context()
		if d.cfg.brokenTrust {
			trust = ctx
		}
		if d.term(ctx, trust, r, inc, ls, false) {
			_ = ls.Release(context.WithoutCancel(ctx))
		}
		sleep(ctx, d.randN(10*time.Millisecond))
	}
}

// term records one term (leadership or permit) as a Section while its holder
// trusts it (until trust ends or its random length runs out) and returns
// whether the holder is still alive. An election leader writes its fence to
// the register every TTL/8, after an ownership check; a pause lands right
// before such a write (or, on a permit, at the same moment).
func (d *drill) term(ctx, trust context.Context, r *replica, inc *incarnation, ls *leasehold.Lease, write bool) (alive bool) {
	sec := Section{Replica: r.id, Incarnation: inc.n, Key: groupKey, Token: ls.Token(), Fence: ls.Fence(),
		Degraded: ls.Degraded(), Start: d.rec.since()}
	id := r.h.call(wire{K: "open", Section: &sec, Token: sec.Token}).Sec
	sec.ID = id
	r.setWorking(0, !ls.Degraded())
	defer r.setWorking(-1, false)
	length := d.cfg.WorkMin + d.randN(d.cfg.WorkMax-d.cfg.WorkMin)
	if write {
		length *= 2
	}
	if d.cfg.brokenTrust {
		length += 3 * d.cfg.TTL
	}
	deadline := time.NewTimer(length)
	defer deadline.Stop()
	worked := false
	end := func(outcome string) bool {
		at := d.rec.since()
		switch {
		case inc.dead(): // the crash also ends ctx: whichever select saw first
			r.crashed(groupKey, ls.Token(), id, worked)
			return false
		case trust.Err() != nil: // it may have ended during a pause
			at, outcome = d.trustEnd(ls), causeName(ls.Err())
		}
		r.h.call(wire{K: "end", Sec: id, At: at, Text: outcome, OK: worked})
		return true
	}
	for {
		step := time.NewTimer(d.cfg.TTL/8 + d.randN(d.cfg.TTL/8))
		select {
		case <-step.C:
		case <-deadline.C:
			return end("term over")
		case <-trust.Done():
			step.Stop()
			return end("")
		case <-inc.crash:
			step.Stop()
			return end("crashed")
		case <-ctx.Done():
			step.Stop()
			return end("stopped")
		}
		if trust.Err() != nil { // the last check before the write
			continue
		}
		if write {
			r.checkBelief(ls, &sec)
		}
		r.h.call(wire{K: "prewrite", Sec: id, Key: ls.Key(), Token: ls.Token()})
		if inc.dead() {
			continue
		}
		if write {
			r.h.call(wire{K: "write", Sec: id, Fence: ls.Fence(), Value: fmt.Sprintf("r%d/s%d", r.id, id)})
			worked = true
		}
	}
}

// trustEnd is when a holder stopped trusting a lease whose context ended:
// now, or its ValidUntil when that came first (the holder noticed late).
func (d *drill) trustEnd(ls *leasehold.Lease) time.Duration {
	if d.cfg.brokenTrust {
		return d.rec.since()
	}
	return min(d.rec.since(), ls.ValidUntil().Sub(d.rec.t0))
}

// takenOver reports whether a paused holder's place was taken meanwhile:
// its job written (jobs), a write by another leader (election), another
// replica's permit (semaphore).
func (d *drill) takenOver(ev pauseEvent) bool {
	if d.cfg.Workload == WorkloadJobs {
		return d.done[ev.job].Load()
	}
	taken := false
	d.rec.count(func(h *History) {
		for _, o := range h.Ops {
			taken = taken || o.Write && o.Accepted && o.Client != ev.replica && o.Call > ev.at
		}
		for _, a := range h.Acquisitions {
			taken = taken || d.cfg.Workload == WorkloadSemaphore && a.Replica != ev.replica && a.At > ev.at
		}
	})
	return taken
}

// groupLocks returns what the store holds for the workload: the locks
// under keyPrefix, or the semaphore's live permits.
func (d *drill) groupLocks(ctx context.Context) ([]driver.LockInfo, error) {
	if d.cfg.Workload != WorkloadSemaphore {
		return d.be.observer().List(ctx, keyPrefix)
	}
	info, err := d.be.observer().Permits(ctx, groupKey)
	return info.Holders, err
}

// checkGroup decides the election or semaphore workload's invariants.
func checkGroup(cfg Config, h History, rep *Report) []Invariant {
	if cfg.Workload == WorkloadElection {
		stale := checkStale(h)
		return []Invariant{
			checkTrusted(h, 1, "at most one trusted leader", stale.Verdict == Pass && !cfg.NoFencing),
			stale,
			checkLinearizable(h, !cfg.NoFencing),
			checkTakeover(cfg, h, rep),
			checkFences(h),
			checkStuck(cfg, h),
			checkBeliefs(h, stale.Verdict == Pass && !cfg.NoFencing),
			terms(h),
			checkFailovers(h),
		}
	}
	return []Invariant{
		checkTrusted(h, cfg.Permits, fmt.Sprintf("at most %d trusted holders", cfg.Permits), false),
		checkPermitFences(h),
		checkStuck(cfg, h),
		terms(h),
	}
}

// checkTrusted sweeps the Sections: at no moment more than limit of them
// open (each shortened by trustSlack at its end). A moment after a store
// restart that every open Section started before is counted apart: the
// restart lost the lock, so the store handed it out while its holder still
// trusted it until its next renewal.
func checkTrusted(h History, limit int, name string, fenced bool) Invariant {
	iv := Invariant{Name: name}
	type edge struct {
		at    time.Duration
		delta int
		sec   int
	}
	var edges []edge
	for i, s := range h.Sections {
		end := s.End - trustSlack
		if s.End == 0 {
			end = h.Duration
		}
		if end > s.Start {
			edges = append(edges, edge{s.Start, 1, i}, edge{end, -1, i})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int { // ends before starts at the same instant
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	open := map[int]bool{}
	bad, restart, failover, most := 0, 0, 0, 0
	for _, e := range edges {
		if e.delta < 0 {
			delete(open, e.sec)
			continue
		}
		open[e.sec] = true
		most = max(most, len(open))
		if len(open) <= limit {
			continue
		}
		var who []string
		first := e.at
		for _, i := range slices.Sorted(maps.Keys(open)) {
			s := h.Sections[i]
			first = min(first, s.Start)
			who = append(who, fmt.Sprintf("replica %d fence %d %v–%v", s.Replica, s.Fence, fmtDur(s.Start), fmtDur(s.End)))
		}
		switch trustedApart(h, first, e.at, fenced) {
		case "restart":
			restart++
			iv.detail("at %v, across a store restart (expected until the next renewal): %s", fmtDur(e.at), strings.Join(who, "; "))
			continue
		case "failover":
			failover++
			iv.detail("at %v, during a failover (a holder on the old master; the fence rejected every stale write): %s", fmtDur(e.at), strings.Join(who, "; "))
			continue
		}
		bad++
		iv.detail("at %v, %d trusted at once: %s", fmtDur(e.at), len(open), strings.Join(who, "; "))
	}
	iv.Verdict = passUnless(bad > 0)
	iv.Summary = fmt.Sprintf("%d moments with more than %d trusted (at most %d at once over %d terms); %d more across a store restart",
		bad, limit, most, len(h.Sections), restart)
	if len(h.Failovers) > 0 {
		iv.Summary += fmt.Sprintf("; %d more during a failover, counted apart only when no stale write was accepted", failover)
	}
	return iv
}

// trustedApart says why too many holders trusted at once from first to at
// is counted apart: "restart" (a store restart in between), "failover"
// (at during a failover and fenced: no stale write accepted), or "".
func trustedApart(h History, first, at time.Duration, fenced bool) string {
	if h.restartIn(first, at) {
		return "restart"
	}
	if fenced && h.inFailover(at) {
		return "failover"
	}
	return ""
}

// checkPermitFences: every permit's fence is unique, and a permit acquired
// after another one's acquire returned has a greater fence (concurrent
// acquisitions are not ordered), also across a store restart.
func checkPermitFences(h History) Invariant {
	iv := Invariant{Name: "fences unique and increasing"}
	seen := map[uint64]int{}
	dup, backward := 0, 0
	for _, a := range h.Acquisitions {
		if seen[a.Fence]++; seen[a.Fence] == 2 {
			dup++
			iv.detail("fence %d granted more than once", a.Fence)
		}
	}
	for _, a := range h.Acquisitions {
		for _, p := range h.Acquisitions {
			if p.Token != a.Token && p.At < a.Call && a.Fence <= p.Fence {
				backward++
				iv.detail("fence %d acquired at %v after fence %d was returned at %v", a.Fence, fmtDur(a.At), p.Fence, fmtDur(p.At))
				break
			}
		}
	}
	iv.Verdict = passUnless(dup+backward > 0)
	iv.Summary = fmt.Sprintf("%d of %d permits repeated a fence, %d went backward", dup, len(h.Acquisitions), backward)
	return iv
}

// terms summarizes the terms (INFO).
func terms(h History) Invariant {
	replicas := map[int]bool{}
	for _, s := range h.Sections {
		replicas[s.Replica] = true
	}
	return Invariant{Name: "terms", Verdict: Info,
		Summary: fmt.Sprintf("%d terms held by %d replicas: %s", len(h.Sections), len(replicas), outcomes(h.Sections))}
}
