package drill

import (
	"fmt"
	"html"
	"io"
	"strings"
	"time"

	"github.com/leasehold/leasehold/fencetest"
)

// replicaColors are the bar colours of replicas 0, 1, 2, ... (cycled).
var replicaColors = []string{"#4e79a7", "#59a14f", "#b07aa1", "#f28e2b", "#76b7b2", "#edc948", "#9c755f", "#bab0ac"}

// faultColors shade fault windows.
var faultColors = map[Fault]string{
	FaultPause: "#9467bd", FaultOutage: "#d62728", FaultCrash: "#000000",
	FaultLatency: "#ff7f0e", FaultLostReply: "#17becf", FaultRestart: "#8c564b", FaultFailover: "#e377c2",
}

// WriteTimeline writes a self-contained SVG of the drill: one row per job,
// a bar per lease coloured by replica (hatched while its holder was paused,
// faded when degraded), accepted writes as dots, rejected writes as red
// crosses, crashes as black crosses, and fault windows shaded across all rows.
func (r *Report) WriteTimeline(w io.Writer) error {
	h := r.History
	const (
		left, right, top, rowH, barH = 84.0, 24.0, 64.0, 14.0, 9.0
		width                        = 1400.0
	)
	jobs := max(h.Jobs, 1)
	plotW := width - left - right
	end := h.Duration
	for _, s := range h.Sections {
		end = max(end, s.End)
	}
	for _, wd := range h.Windows {
		end = max(end, wd.End)
	}
	end = max(end+end/50, time.Second)
	x := func(t time.Duration) float64 { return left + plotW*float64(t)/float64(end) }
	y := func(job int) float64 { return top + float64(job)*rowH }
	plotH := float64(jobs) * rowH
	height := top + plotH + 120

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	p(`<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#ffffff" fill-opacity="0.55"/><line x1="0" y1="0" x2="0" y2="6" stroke="#333" stroke-width="2.5"/></pattern></defs>` + "\n")
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	c := r.Config
	verdict := "every invariant held"
	if !r.Passed {
		verdict = fmt.Sprintf("%d invariants FAILED", len(r.Failed()))
	}
	p(`<text x="%.0f" y="18" font-size="14" font-weight="bold">leasehold drill: %d replicas, %d jobs, TTL %v, %s, renew failure %s, fencing %s: %s</text>`+"\n",
		left, c.Replicas, c.Jobs, c.TTL, c.OnStoreError, c.OnRenewFailure, onOff(c.Fencing), html.EscapeString(verdict))

	// Fault windows.
	for _, wd := range h.Windows {
		col := faultColors[wd.Fault]
		x0, x1 := x(wd.Start), x(wd.End)
		title := html.EscapeString(fmt.Sprintf("%s %v–%v: %s", wd.Fault, fmtDur(wd.Start), fmtDur(wd.End), wd.Note))
		if x1-x0 < 2 {
			p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s" stroke-width="2" stroke-dasharray="4 3"><title>%s</title></line>`+"\n", x0, top-14, x0, top+plotH, col, title)
		} else {
			p(`<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.13"><title>%s</title></rect>`+"\n", x0, top-14, x1-x0, plotH+14, col, title)
		}
		p(`<text x="%.1f" y="%.0f" fill="%s" font-weight="bold">%s</text>`+"\n", x0+2, top-18, col, wd.Fault)
	}

	// Rows and time axis.
	for j := range jobs {
		if j%2 == 1 {
			p(`<rect x="%.0f" y="%.1f" width="%.0f" height="%.0f" fill="#000" fill-opacity="0.03"/>`+"\n", left, y(j), plotW, rowH)
		}
		if jobs <= 60 || j%5 == 0 {
			p(`<text x="%.0f" y="%.1f" text-anchor="end" fill="#444" font-size="10">%s</text>`+"\n", left-6, y(j)+rowH-3, jobKey(j)[len(keyPrefix):])
		}
	}
	p(`<text x="%.0f" y="%.0f" text-anchor="end" fill="#444" font-size="10">job</text>`+"\n", left-6, top-4)
	step := tickStep(end)
	for t := time.Duration(0); t <= end; t += step {
		p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ccc" stroke-width="0.5"/>`+"\n", x(t), top, x(t), top+plotH)
		p(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="#444">%v</text>`+"\n", x(t), top+plotH+14, t)
	}

	// Leases. Overlapping leases of one job share its row in lanes.
	lane, lanes := assignLanes(h.Sections)
	for i, s := range h.Sections {
		x0, x1 := x(s.Start), x(max(s.End, s.Start))
		if x1-x0 < 1.5 {
			x1 = x0 + 1.5
		}
		col := replicaColors[s.Replica%len(replicaColors)]
		op := "0.9"
		if s.Degraded {
			op = "0.35"
		}
		title := html.EscapeString(fmt.Sprintf("replica %d (process %d), job %d, fence %d%s: %v–%v, %s",
			s.Replica, s.Incarnation, s.Job, s.Fence, degradedNote(s.Degraded), fmtDur(s.Start), fmtDur(s.End), s.Outcome))
		bh := (rowH - 3) / float64(lanes[s.Job])
		if lanes[s.Job] == 1 {
			bh = barH
		}
		by := y(s.Job) + (rowH-bh*float64(lanes[s.Job]))/2 + bh*float64(lane[i])
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%s"`, x0, by, x1-x0, bh, col, op)
		if s.Degraded {
			p(` stroke="%s" stroke-dasharray="3 2"`, col)
		}
		p(`><title>%s</title></rect>`+"\n", title)
		if s.PauseEnd > s.PauseStart {
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#hatch)"><title>paused %v</title></rect>`+"\n",
				x(s.PauseStart), by, x(s.PauseEnd)-x(s.PauseStart), bh, fmtDur(s.PauseEnd-s.PauseStart))
		}
		if s.Outcome == "crashed" {
			cross(&b, x1, y(s.Job)+rowH/2, 5, "#000", 2.2, "crashed without release")
		}
	}

	// Writes.
	ops := registerOps(h.Ops)
	stale := map[fencetest.Op]bool{}
	for _, s := range fencetest.StaleWrites(ops) {
		stale[s.Write] = true
	}
	for i, o := range h.Ops {
		if !o.Write {
			continue
		}
		cx, cy := x(o.Return), y(o.Job)+rowH/2
		if stale[ops[i]] {
			p(`<circle cx="%.1f" cy="%.1f" r="6" fill="none" stroke="#e00000" stroke-width="2"><title>STALE write fence %d by replica %d accepted at %v</title></circle>`+"\n", cx, cy, o.Fence, o.Client, fmtDur(o.Return))
		}
		if o.Accepted {
			p(`<circle cx="%.1f" cy="%.1f" r="2.6" fill="#111"><title>write fence %d by replica %d accepted at %v</title></circle>`+"\n", cx, cy, o.Fence, o.Client, fmtDur(o.Return))
		} else {
			cross(&b, cx, cy, 5, "#e00000", 2.6, fmt.Sprintf("write fence %d by replica %d rejected at %v", o.Fence, o.Client, fmtDur(o.Return)))
		}
	}

	// Legend.
	ly := top + plotH + 36
	lx := left
	for i := range c.Replicas {
		p(`<rect x="%.0f" y="%.0f" width="18" height="9" fill="%s" fill-opacity="0.9"/><text x="%.0f" y="%.0f">replica %d</text>`+"\n", lx, ly-8, replicaColors[i%len(replicaColors)], lx+22, ly, i)
		lx += 86
	}
	p(`<rect x="%.0f" y="%.0f" width="18" height="9" fill="url(#hatch)"/><text x="%.0f" y="%.0f">paused holder</text>`+"\n", lx, ly-8, lx+22, ly)
	lx += 106
	p(`<rect x="%.0f" y="%.0f" width="18" height="9" fill="#888" fill-opacity="0.35" stroke="#888" stroke-dasharray="3 2"/><text x="%.0f" y="%.0f">degraded (fail-open)</text>`+"\n", lx, ly-8, lx+22, ly)
	lx += 140
	p(`<circle cx="%.0f" cy="%.0f" r="2.6" fill="#111"/><text x="%.0f" y="%.0f">write accepted</text>`+"\n", lx+6, ly-4, lx+14, ly)
	lx += 106
	cross(&b, lx+6, ly-4, 5, "#e00000", 2.6, "")
	p(`<text x="%.0f" y="%.0f">write rejected (stale)</text>`+"\n", lx+16, ly)
	lx += 150
	cross(&b, lx+6, ly-4, 5, "#000", 2.2, "")
	p(`<text x="%.0f" y="%.0f">crash</text>`+"\n", lx+16, ly)
	lx += 60
	p(`<circle cx="%.0f" cy="%.0f" r="6" fill="none" stroke="#e00000" stroke-width="2"/><text x="%.0f" y="%.0f">stale write ACCEPTED</text>`+"\n", lx+6, ly-4, lx+16, ly)

	ly += 22
	var verdicts []string
	for _, iv := range r.Invariants {
		if iv.Verdict != Info {
			verdicts = append(verdicts, fmt.Sprintf("%s %s", iv.Verdict, iv.Name))
		}
	}
	for i := 0; i < len(verdicts); i += 4 {
		p(`<text x="%.0f" y="%.0f" fill="#333">%s</text>`+"\n", left, ly, html.EscapeString(strings.Join(verdicts[i:min(i+4, len(verdicts))], "  ·  ")))
		ly += 16
	}
	p("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// assignLanes puts overlapping leases of one job in separate lanes: it
// returns each section's lane and each job's lane count.
func assignLanes(secs []Section) (lane []int, lanes map[int]int) {
	lane = make([]int, len(secs))
	lanes = map[int]int{}
	ends := map[int][]time.Duration{} // per job: the end of the last lease in each lane
	for i, s := range secs {
		l := 0
		for l < len(ends[s.Job]) && ends[s.Job][l] > s.Start {
			l++
		}
		if l == len(ends[s.Job]) {
			ends[s.Job] = append(ends[s.Job], 0)
		}
		ends[s.Job][l] = max(s.End, s.Start)
		lane[i] = l
		lanes[s.Job] = max(lanes[s.Job], l+1)
	}
	return lane, lanes
}

func degradedNote(d bool) string {
	if d {
		return " (degraded)"
	}
	return ""
}

func cross(b *strings.Builder, cx, cy, r float64, col string, w float64, title string) {
	t := ""
	if title != "" {
		t = "<title>" + html.EscapeString(title) + "</title>"
	}
	fmt.Fprintf(b, `<g stroke="%s" stroke-width="%.1f" stroke-linecap="round"><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>%s</g>`+"\n",
		col, w, cx-r, cy-r, cx+r, cy+r, cx-r, cy+r, cx+r, cy-r, t)
}

// tickStep picks an axis step giving 5–15 ticks.
func tickStep(end time.Duration) time.Duration {
	for _, s := range []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second} {
		if end/s <= 15 {
			return s
		}
	}
	return time.Minute
}
