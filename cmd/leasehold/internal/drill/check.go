package drill

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leasehold/leasehold/fencetest"
)

// Verdict is the outcome of one invariant.
type Verdict string

// Verdicts. INFO reports numbers without a pass/fail judgement.
const (
	Pass Verdict = "PASS"
	Fail Verdict = "FAIL"
	Info Verdict = "INFO"
)

// Invariant is one checked property with its verdict and the numbers behind it.
type Invariant struct {
	Name    string   `json:"name"`
	Verdict Verdict  `json:"verdict"`
	Summary string   `json:"summary"`
	Details []string `json:"details,omitempty"`
}

// maxDetails caps the examples listed per invariant.
const maxDetails = 8

func (iv *Invariant) detail(format string, args ...any) {
	if len(iv.Details) < maxDetails {
		iv.Details = append(iv.Details, fmt.Sprintf(format, args...))
	}
}

// clockSlack absorbs the store's and the recorder's clock reads around one
// instant.
const clockSlack = 2 * time.Millisecond

// linearizabilityTimeout bounds the porcupine check.
const linearizabilityTimeout = 20 * time.Second

// Check decides every invariant from a recorded history alone. cfg supplies
// the TTL and whether the register was fenced.
func Check(cfg Config, h History) *Report {
	rep := &Report{Config: summarize(cfg), History: h, Jobs: h.Jobs, Done: h.Done, Duration: h.Duration, Events: h.Events}
	switch cfg.Workload {
	case WorkloadElection, WorkloadSemaphore:
		rep.Invariants = checkGroup(cfg, h, rep)
		rep.Invariants = append(rep.Invariants, eventCounts(h), faultWindows(h))
	default:
		rep.Invariants = checkJobs(cfg, h, rep)
	}
	if iv, ok := skippedFaults(h); ok {
		rep.Invariants = append(rep.Invariants, iv)
	}
	if len(h.Workers) > 0 {
		rep.Invariants = append(rep.Invariants, workerProcesses(h))
	}
	rep.Passed = len(rep.Failed()) == 0
	return rep
}

// checkJobs decides the jobs workload's invariants.
func checkJobs(cfg Config, h History, rep *Report) []Invariant {
	stale := checkStale(h)
	fenced := stale.Verdict == Pass && !cfg.NoFencing
	ivs := []Invariant{
		stale,
		checkLinearizable(h, !cfg.NoFencing),
		checkDuplicates(h, fenced),
		checkTakeover(cfg, h, rep),
		checkFences(h),
		checkStuck(cfg, h),
		checkBeliefs(h, fenced),
		checkProgress(h),
		eventCounts(h),
		faultWindows(h),
	}
	if len(h.Failovers) > 0 {
		ivs = append(ivs, checkFailovers(h))
	}
	return ivs
}

// passUnless is Fail when failed, else Pass.
func passUnless(failed bool) Verdict {
	if failed {
		return Fail
	}
	return Pass
}

func fmtDur(d time.Duration) string { return d.Round(time.Millisecond).String() }

func byJob(ops []Op) map[int][]Op {
	m := make(map[int][]Op)
	for _, o := range ops {
		m[o.Job] = append(m[o.Job], o)
	}
	return m
}

// writeCounts counts the writes accepted, rejected as stale and refused
// otherwise (no fence, a register error).
func writeCounts(ops []Op) (accepted, rejected, refused int) {
	for _, o := range ops {
		switch {
		case !o.Write:
		case o.Accepted:
			accepted++
		case o.Err != "":
			refused++
		default:
			rejected++
		}
	}
	return accepted, rejected, refused
}

// staleBetween counts the writes sent in [from, to] that the register
// rejected as stale.
func staleBetween(h *History, from, to time.Duration) int {
	n := 0
	for _, o := range h.Ops {
		if o.Write && !o.Accepted && o.Err == "" && o.Call >= from && o.Call <= to {
			n++
		}
	}
	return n
}

// checkStale: every accepted write's fence is >= the fence of every accepted
// write to the same job that returned before it was called
// (fencetest.StaleWrites; fencetest.Check would run porcupine a second time,
// on the fenced model also when fencing is off).
func checkStale(h History) Invariant {
	iv := Invariant{Name: "no stale write accepted"}
	stale := fencetest.StaleWrites(registerOps(h.Ops))
	for _, s := range stale {
		iv.detail("job %s: write with fence %d (replica %d) accepted at %v after fence %d (replica %d) was accepted at %v",
			s.Write.Key, s.Write.Fence, s.Write.Client, fmtDur(s.Write.Call), s.After.Fence, s.After.Client, fmtDur(s.After.Return))
	}
	accepted, rejected, refused := writeCounts(h.Ops)
	iv.Verdict = passUnless(len(stale) > 0)
	iv.Summary = fmt.Sprintf("%d stale writes accepted; %d writes accepted, %d rejected as stale, %d refused without a fence", len(stale), accepted, rejected, refused)
	return iv
}

// registerOps converts the register's history to fencetest's, keyed by job.
func registerOps(ops []Op) []fencetest.Op {
	out := make([]fencetest.Op, len(ops))
	for i, o := range ops {
		out[i] = fencetest.Op{Client: o.Client, Key: strconv.Itoa(o.Job), Write: o.Write, Fence: o.Fence, Value: o.Value,
			Found: o.Found, Accepted: o.Accepted, Err: o.Err, Call: o.Call, Return: o.Return}
	}
	return out
}

func checkLinearizable(h History, fenced bool) Invariant {
	iv := Invariant{Name: "register history linearizable"}
	kind := "fenced register (accept fence >= last, reject lower)"
	if !fenced {
		kind = "plain register (fencing off: accept every write)"
	}
	start := time.Now()
	res := fencetest.Linearizable(registerOps(h.Ops), fenced, linearizabilityTimeout)
	took := time.Since(start)
	switch res {
	case porcupine.Ok:
		iv.Verdict = Pass
		iv.Summary = fmt.Sprintf("%d operations on %d jobs linearizable as a %s (porcupine, %v)", len(h.Ops), len(byJob(h.Ops)), kind, fmtDur(took))
	case porcupine.Illegal:
		iv.Verdict = Fail
		iv.Summary = fmt.Sprintf("%d operations are NOT linearizable as a %s (porcupine)", len(h.Ops), kind)
	default:
		iv.Verdict = Info
		iv.Summary = fmt.Sprintf("porcupine could not decide within %v", linearizabilityTimeout)
	}
	return iv
}

// checkDuplicates counts jobs whose result was accepted from more than one
// lease: the job's side effect landed twice. A duplicate whose leases straddle
// a store restart is counted apart: the restart lost the lock, so the store
// handed the key to a second holder while the first still trusted its lease
// (until its next renewal); fencing keeps the two writes in fence order but
// cannot stop the first one landing. Overlapping critical sections that
// reached their write (a paused holder and its successor) are reported too;
// they are harmless when only one of the writes is accepted. A duplicate
// whose leases straddle a failover is counted apart in the same way, but
// only when fenced is true (no stale write was accepted): the failover
// opened a window with two holders and the fence kept their writes in
// order.
func checkDuplicates(h History, fenced bool) Invariant {
	iv := Invariant{Name: "no duplicate execution"}
	jobs := byJob(h.Ops)
	dupJobs, extra, restartDups, failoverDups := 0, 0, 0, 0
	for _, j := range slices.Sorted(maps.Keys(jobs)) {
		secs := map[int]bool{}
		var order []Op
		var who []string
		for _, o := range jobs[j] {
			if o.Write && o.Accepted && !secs[o.Section] {
				secs[o.Section] = true
				order = append(order, o)
				who = append(who, fmt.Sprintf("replica %d fence %d at %v", o.Client, o.Fence, fmtDur(o.Call)))
			}
		}
		if len(secs) < 2 {
			continue
		}
		if straddles(h, h.Restarts, order) {
			restartDups++
			iv.detail("job %d: results accepted from %d leases on both sides of a store restart (expected: the restart lost the lock): %s", j, len(secs), strings.Join(who, "; "))
			continue
		}
		if fenced && failoverDuplicate(h, order) {
			failoverDups++
			iv.detail("job %d: results accepted from %d overlapping leases, the later granted during a failover, in fence order (two holders while clients learned the new master): %s", j, len(secs), strings.Join(who, "; "))
			continue
		}
		dupJobs++
		extra += len(secs) - 1
		iv.detail("job %d: results accepted from %d leases: %s", j, len(secs), strings.Join(who, "; "))
	}
	overlaps := workedOverlaps(h)
	iv.Verdict = passUnless(dupJobs > 0)
	iv.Summary = fmt.Sprintf("%d jobs executed more than once (%d extra accepted results); %d more across a store restart that lost the lock; %d overlapping critical sections reached their write",
		dupJobs, extra, restartDups, overlaps)
	switch {
	case len(h.Failovers) > 0 && fenced:
		iv.Summary += fmt.Sprintf("; %d more across a failover, every stale write rejected", failoverDups)
	case len(h.Failovers) > 0:
		iv.Summary += "; none counted apart across the failover (fencing off or a stale write accepted)"
	}
	return iv
}

// workedOverlaps counts pairs of critical sections of one job that
// overlapped in time and both reached their write.
func workedOverlaps(h History) int {
	overlaps := 0
	var worked []Section
	for _, s := range h.Sections {
		if s.Worked {
			worked = append(worked, s)
		}
	}
	for i, a := range worked {
		for _, b := range worked[i+1:] {
			if a.Job == b.Job && a.Start < b.End && b.Start < a.End {
				overlaps++
			}
		}
	}
	return overlaps
}

// straddles reports whether the accepted writes came from leases acquired
// on both sides of one of the moments (store restarts, failovers), with a
// write of a lease from before it landing after it.
func straddles(h History, moments []time.Duration, writes []Op) bool {
	for _, r := range moments {
		before, after := false, false
		for _, o := range writes {
			if o.Section < 0 || o.Section >= len(h.Sections) {
				return false
			}
			if h.Sections[o.Section].Start >= r {
				after = true
			} else if o.Call >= r {
				before = true
			}
		}
		if before && after {
			return true
		}
	}
	return false
}

// lastAppliedBefore returns the last call of token sent before t that the
// store surely applied: one that succeeded (or, on the memory store, whose
// reply was dropped after the store applied it). A call that failed without
// an answer through a proxy (Latest after Return) may never have been
// applied, and its holder does not count on it either (its ValidUntil
// follows its last successful renewal): it is no evidence that a takeover
// came early. (The stuck-lock check counts it, the other way round.)
func lastAppliedBefore(h History, token string, t time.Duration) (Call, bool) {
	var last Call
	found := false
	for _, c := range h.Applied[token] {
		if c.Call <= t && c.Call >= last.Call && c.Latest <= c.Return {
			last, found = c, true
		}
	}
	return last, found
}

// checkTakeover measures, for every holder that stopped without releasing
// (crash, pause), the time from its last applied acquire/renew to the next
// holder's acquire of the key. Less than TTL would be a lock handed out
// while still held.
func checkTakeover(cfg Config, h History, rep *Report) Invariant {
	iv := Invariant{Name: "takeover after a silent holder"}
	ttl := cfg.TTL
	early := 0
	for _, s := range h.Stops {
		next := h.nextHolder(s)
		if next == nil {
			iv.detail("%s of replica %d on %s: no other holder took the key", s.Fault, s.Replica, s.Key)
			continue
		}
		last, ok := lastAppliedBefore(h, s.Token, next.At)
		if !ok {
			continue
		}
		restarted := h.restartIn(last.Call, next.At)
		// The store applied the last renewal after it was sent and the next
		// acquire before it returned: the key was handed out early if and
		// only if that gap is under TTL. The takeover reported is measured
		// from the renewal's return, as a client sees it.
		d := next.At - last.Return
		gap := next.At - last.Call
		if restarted {
			iv.detail("%s on %s: %v, not counted (the store restarted in between)", s.Fault, s.Key, fmtDur(d))
			continue
		}
		rep.Takeovers = append(rep.Takeovers, Takeover{Fault: s.Fault, Key: s.Key, Takeover: d, TTL: ttl})
		if gap < ttl-clockSlack {
			early++
			iv.detail("%s on %s: taken over %v after the last renewal, before the TTL %v ran out (replica %d stopped at %v; its last applied call sent at %v, returned at %v; replica %d acquired at %v)",
				s.Fault, s.Key, fmtDur(d), ttl, s.Replica, fmtDur(s.At), fmtDur(last.Call), fmtDur(last.Return), next.Replica, fmtDur(next.At))
		} else {
			iv.detail("%s on %s: taken over %v after the last renewal (%.2f × TTL)", s.Fault, s.Key, fmtDur(d), float64(d)/float64(ttl))
		}
	}
	if len(rep.Takeovers) == 0 {
		iv.Verdict = Info
		iv.Summary = "no takeover measured (no crash or pause was injected, or nobody took the key over)"
		return iv
	}
	ds := make([]time.Duration, len(rep.Takeovers))
	for i, t := range rep.Takeovers {
		ds[i] = t.Takeover
	}
	slices.Sort(ds)
	p50, mx := ds[len(ds)/2], ds[len(ds)-1]
	iv.Verdict = passUnless(early > 0)
	iv.Summary = fmt.Sprintf("%d takeovers: min %v, p50 %v, max %v from the last renewal's return, against TTL %v (max %.2f × TTL); %d handed out before the TTL ran out",
		len(ds), fmtDur(ds[0]), fmtDur(p50), fmtDur(mx), ttl, float64(mx)/float64(ttl), early)
	return iv
}

// nextHolder returns the first acquisition of s's key by another token
// after s, or nil.
func (h *History) nextHolder(s Stop) *Acquisition {
	var next *Acquisition
	for i, a := range h.Acquisitions {
		if a.Key == s.Key && a.Token != s.Token && a.At > s.At && (next == nil || a.At < next.At) {
			next = &h.Acquisitions[i]
		}
	}
	return next
}

// checkFences: successive acquisitions of a key carry strictly increasing
// fences, also across a store restart.
func checkFences(h History) Invariant {
	iv := Invariant{Name: "fences increase"}
	byKey := map[string][]Acquisition{}
	for _, a := range h.Acquisitions {
		byKey[a.Key] = append(byKey[a.Key], a)
	}
	bad, pairs, acrossRestart, acrossFailover := 0, 0, 0, 0
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		as := byKey[k]
		slices.SortStableFunc(as, func(a, b Acquisition) int { return cmp.Compare(a.At, b.At) })
		for i := 1; i < len(as); i++ {
			p, a := as[i-1], as[i]
			if p.Token == a.Token {
				continue
			}
			pairs++
			if h.restartIn(p.At, a.At) {
				acrossRestart++
			}
			if slices.ContainsFunc(h.Failovers, func(f Span) bool {
				return (f.Start >= p.At && f.Start <= a.At) || during(f, a.At)
			}) {
				acrossFailover++
			}
			if a.Fence <= p.Fence {
				bad++
				iv.detail("%s: fence %d at %v after fence %d at %v", k, a.Fence, fmtDur(a.At), p.Fence, fmtDur(p.At))
			}
		}
	}
	iv.Verdict = passUnless(bad > 0)
	iv.Summary = fmt.Sprintf("%d of %d successive acquisitions went backward or repeated a fence (%d across a store restart, %d across a failover)", bad, pairs, acrossRestart, acrossFailover)
	return iv
}

func checkStuck(cfg Config, h History) Invariant {
	iv := Invariant{Name: "no lock stuck past its TTL"}
	for _, a := range h.Stuck {
		iv.detail("%s at %v: %s", a.Key, fmtDur(a.At), a.Detail)
	}
	iv.Verdict = passUnless(len(h.Stuck) > 0)
	lostAcq := h.Events["store_error"]
	iv.Summary = fmt.Sprintf("%d locks seen more than TTL (%v) after their holder's last applied acquire/renew or the key's last release (a grant); %d store errors (incl. lost replies) during the run",
		len(h.Stuck), cfg.TTL, lostAcq)
	return iv
}

// checkBeliefs: no holder trusts a lease the store does not hold for it.
// Those seen during a failover (a holder still on the old master) are
// counted apart when fenced is true (no stale write was accepted), as
// violations otherwise.
func checkBeliefs(h History, fenced bool) Invariant {
	iv := Invariant{Name: "no client trusts a lock it does not hold"}
	bad := h.Beliefs
	if !fenced {
		bad = append(slices.Clone(bad), h.FailoverBeliefs...)
	}
	for _, a := range bad {
		iv.detail("%s at %v: %s", a.Key, fmtDur(a.At), a.Detail)
	}
	iv.Verdict = passUnless(len(bad) > 0)
	iv.Summary = fmt.Sprintf("%d of %d ownership checks found a trusted lease the store did not hold (%d unanswered by the store, %d after a restart lost the lock: expected until the next renewal)",
		len(bad), h.BeliefChecks, h.BeliefUnchecked, h.BeliefsAfterRestart)
	if len(h.Failovers) > 0 && fenced {
		iv.Summary += fmt.Sprintf("; %d more during a failover (a holder on the old master while the new one named another holder or none), counted apart because the fence rejected every stale write: see \"failover\"", len(h.FailoverBeliefs))
	}
	return iv
}

func checkProgress(h History) Invariant {
	iv := Invariant{Name: "every job done", Verdict: passUnless(h.Done < h.Jobs)}
	iv.Summary = fmt.Sprintf("%d of %d jobs done in %v", h.Done, h.Jobs, fmtDur(h.Duration))
	return iv
}

func eventCounts(h History) Invariant {
	iv := Invariant{Name: "lease events", Verdict: Info}
	e := h.Events
	iv.Summary = fmt.Sprintf("%d acquires, %d renew failures, %d abandoned, %d lost, %d expired locally, %d fail-open fallbacks, %d not-owned, %d stale writes rejected, %d store errors",
		len(h.Acquisitions), e["renew_failed"], e["abandoned"], e["lost"], e["expired"], e["fail_open"], e["not_owned"], e["stale_write"], e["store_error"])
	return iv
}

func faultWindows(h History) Invariant {
	iv := Invariant{Name: "faults injected", Verdict: Info}
	names := make([]string, 0, len(h.Windows))
	for _, w := range h.Windows {
		if w.Skipped {
			names = append(names, string(w.Fault)+" (skipped)")
		} else {
			names = append(names, string(w.Fault))
		}
		iv.detail("%-9s %v–%v: %s", w.Fault, fmtDur(w.Start), fmtDur(w.End), w.Note)
	}
	if len(names) == 0 {
		iv.Summary = "none"
	} else {
		iv.Summary = strings.Join(names, ", ")
	}
	return iv
}

// skippedFaults is an INFO verdict naming each fault that could not be
// injected and why; false when none was skipped.
func skippedFaults(h History) (Invariant, bool) {
	iv := Invariant{Name: "faults skipped", Verdict: Info}
	var names []string
	for _, w := range h.Windows {
		if w.Skipped {
			names = append(names, fmt.Sprintf("%s: %s", w.Fault, strings.TrimPrefix(w.Note, "skipped: ")))
		}
	}
	if len(names) == 0 {
		return iv, false
	}
	iv.Summary = strings.Join(names, "; ")
	return iv, true
}

// workerProcesses is an INFO verdict on the worker processes
// (Config.Processes): how many ran, how many the faults stopped or killed.
// The drill reaps every one before Run returns.
func workerProcesses(h History) Invariant {
	iv := Invariant{Name: "worker processes", Verdict: Info}
	stops, crashed, forced := 0, 0, 0
	for _, w := range h.Workers {
		stops += w.Stops
		switch w.Exit {
		case "killed (crash)":
			crashed++
		case "killed (did not stop in time)":
			forced++
		}
		iv.detail("replica %d #%d pid %d %v–%v: %s, %d SIGSTOP", w.Replica, w.Incarnation, w.PID, fmtDur(w.Start), fmtDur(w.End), w.Exit, w.Stops)
	}
	iv.Summary = fmt.Sprintf("%d started, %d SIGSTOP/SIGCONT (pause), %d SIGKILL (crash), %d killed at the end for not stopping; all reaped",
		len(h.Workers), stops, crashed, forced)
	return iv
}
