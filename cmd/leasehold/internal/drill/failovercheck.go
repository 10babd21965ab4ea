package drill

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// twoHolders is one key that had two holders across a failover: a lease
// from before the failover still trusted after another holder was granted
// the key.
type twoHolders struct {
	Key    string
	Window time.Duration // from the new holder's grant to the old holder's stop
}

// checkFailovers is an INFO verdict per failover: how long it took until
// the new master was in place (the sentinels agreed; the standby was
// promoted), which keys had two holders and for how long, what the fence
// did with the old holders' writes, and how the leases in flight ended. It
// fails only when a lease in flight ended without a cause a holder can act
// on; safety itself is judged by the other invariants (stale writes,
// fences, duplicates).
func checkFailovers(h History) Invariant {
	iv := Invariant{Name: "failover", Verdict: Info, Summary: "no failover"}
	var parts []string
	for i, f := range h.Failovers {
		pairs := failoverOverlaps(h, f)
		var longest time.Duration
		keys := make([]string, 0, len(pairs))
		for _, p := range pairs {
			longest = max(longest, p.Window)
			keys = append(keys, fmt.Sprintf("%s %v", p.Key, fmtDur(p.Window)))
		}
		rejected := staleBetween(&h, f.Start, f.End+failoverSettle)
		n, last := failoverBeliefs(h, f)
		ends, unclear := inFlight(h, f)
		for _, s := range unclear {
			iv.Verdict = Fail
			iv.detail("failover %d: replica %d's lease on %s ended with %q, not a cause a holder can act on", i+1, s.Replica, s.Key, s.Outcome)
		}
		parts = append(parts, fmt.Sprintf("failover %d at %v: new master in place after %v; %d keys with two holders (longest window %v); %d ownership checks found a holder trusting a lease the new master did not hold (the last %v after it was in place); %d stale writes rejected; leases in flight ended: %s",
			i+1, fmtDur(f.Start), fmtDur(f.End-f.Start), len(pairs), fmtDur(longest), n, fmtDur(last), rejected, ends))
		if len(keys) > 0 {
			iv.detail("failover %d two-holder windows (new grant to old holder's stop): %s", i+1, strings.Join(keys, ", "))
		}
	}
	if len(parts) > 0 {
		iv.Summary = strings.Join(parts, "; ")
	}
	return iv
}

// during reports whether t lies in failover f or its settling time.
func during(f Span, t time.Duration) bool { return t >= f.Start && t <= f.End+failoverSettle }

// inFailover reports whether t lies in a failover or its settling time.
func (h *History) inFailover(t time.Duration) bool {
	return slices.ContainsFunc(h.Failovers, func(f Span) bool { return during(f, t) })
}

// restartIn reports whether the store lost its data between from and to.
func (h *History) restartIn(from, to time.Duration) bool {
	return slices.ContainsFunc(h.Restarts, func(r time.Duration) bool { return r >= from && r <= to })
}

// failoverOverlaps returns, per key, the longest overlap between two
// holders' leases, the later one granted during failover f (or its settling
// time). Paused holders are left out: their overlap is the pause fault's.
func failoverOverlaps(h History, f Span) []twoHolders {
	longest := map[string]time.Duration{}
	for _, a := range h.Sections {
		if a.PauseStart != 0 {
			continue
		}
		for _, b := range h.Sections {
			if b.Key != a.Key || b.Token == a.Token || b.Start <= a.Start || b.Start >= a.End || !during(f, b.Start) {
				continue
			}
			w := min(a.End, b.End) - b.Start
			if w > longest[a.Key] {
				longest[a.Key] = w
			}
		}
	}
	out := make([]twoHolders, 0, len(longest))
	for k, w := range longest {
		out = append(out, twoHolders{Key: k, Window: w})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// failoverBeliefs counts the ownership checks during failover f that found
// a holder trusting a lease the new master did not hold, and returns how
// long after the sentinels agreed the last one was.
func failoverBeliefs(h History, f Span) (n int, last time.Duration) {
	for _, a := range h.FailoverBeliefs {
		if during(f, a.At) {
			n++
			last = max(last, a.At-f.End)
		}
	}
	return n, last
}

// failoverDuplicate reports whether two of the leases behind the accepted
// writes overlapped, the later one granted during a failover (or its
// settling time): the failover's two-holder window, not a lock handed out
// twice by one master.
func failoverDuplicate(h History, writes []Op) bool {
	for i, x := range writes {
		for _, y := range writes[i+1:] {
			if x.Section < 0 || y.Section < 0 || x.Section >= len(h.Sections) || y.Section >= len(h.Sections) {
				return false
			}
			a, b := h.Sections[x.Section], h.Sections[y.Section]
			if b.Start < a.Start {
				a, b = b, a
			}
			if b.Start >= a.End {
				continue
			}
			if h.inFailover(b.Start) {
				return true
			}
		}
	}
	return false
}

// clearEnds are the ways a lease ends that a holder can act on (causeName,
// and the drill's own outcomes: jobs', terms' and permits').
var clearEnds = []string{"released", "lost", "abandoned", "expired", "closed", "crashed", "stopped",
	"written", "write rejected", "already done", "term over"}

// inFlight counts how the leases held as failover f began ended, and
// returns those that ended with anything else (an unexpected error).
func inFlight(h History, f Span) (string, []Section) {
	var held, unclear []Section
	for _, s := range h.Sections {
		if s.Start > f.Start || s.End < f.Start {
			continue
		}
		held = append(held, s)
		if !slices.Contains(clearEnds, s.Outcome) {
			unclear = append(unclear, s)
		}
	}
	if len(held) == 0 {
		return "none", nil
	}
	return outcomes(held), unclear
}

// outcomes counts how the sections ended, by outcome: "2 lost, 5 written".
func outcomes(secs []Section) string {
	counts := map[string]int{}
	for _, s := range secs {
		counts[s.Outcome]++
	}
	var parts []string
	for _, o := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d %s", counts[o], o))
	}
	return strings.Join(parts, ", ")
}
