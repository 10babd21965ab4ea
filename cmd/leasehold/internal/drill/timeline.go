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
	FaultEvict: "#bcbd22",
}

// Layout of the timeline, in SVG units.
const (
	tlLeft, tlRight, tlTop, tlRowH, tlBarH = 84.0, 24.0, 64.0, 14.0, 9.0
	tlWidth                                = 1400.0
	tlPlotW                                = tlWidth - tlLeft - tlRight
)

// timeline is one SVG being written: the report, the time span it shows and
// the text so far.
type timeline struct {
	r     *Report
	h     History
	b     strings.Builder
	end   time.Duration // the right edge of the plot
	jobs  int           // rows
	plotH float64
}

func (t *timeline) x(d time.Duration) float64 { return tlLeft + tlPlotW*float64(d)/float64(t.end) }
func (t *timeline) y(job int) float64         { return tlTop + float64(job)*tlRowH }
func (t *timeline) p(format string, args ...any) {
	fmt.Fprintf(&t.b, format, args...)
}

// WriteTimeline writes a self-contained SVG of the drill: one row per job,
// a bar per lease coloured by replica (hatched while its holder was paused,
// faded when degraded), accepted writes as dots, rejected writes as red
// crosses, crashes as black crosses, and fault windows shaded across all rows.
func (r *Report) WriteTimeline(w io.Writer) error {
	h := r.History
	t := &timeline{r: r, h: h, end: h.Duration, jobs: max(h.Jobs, 1)}
	for _, s := range h.Sections {
		t.end = max(t.end, s.End)
	}
	for _, wd := range h.Windows {
		t.end = max(t.end, wd.End)
	}
	t.end = max(t.end+t.end/50, time.Second)
	t.plotH = float64(t.jobs) * tlRowH
	t.header()
	t.windows()
	t.rows()
	t.leases()
	t.writes()
	t.legend()
	t.p("</svg>\n")
	_, err := io.WriteString(w, t.b.String())
	return err
}

// header opens the SVG and writes its title.
func (t *timeline) header() {
	height := tlTop + t.plotH + 120
	t.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" `+
		`font-family="sans-serif" font-size="11">`+"\n", tlWidth, height, tlWidth, height)
	t.p(`<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" ` +
		`patternTransform="rotate(45)"><rect width="6" height="6" fill="#ffffff" fill-opacity="0.55"/>` +
		`<line x1="0" y1="0" x2="0" y2="6" stroke="#333" stroke-width="2.5"/></pattern></defs>` + "\n")
	t.p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	c := t.r.Config
	verdict := "every invariant held"
	if !t.r.Passed {
		verdict = fmt.Sprintf("%d invariants FAILED", len(t.r.Failed()))
	}
	t.p(`<text x="%.0f" y="18" font-size="14" font-weight="bold">leasehold drill: %d replicas, %d jobs, TTL %v, `+
		`%s, renew failure %s, fencing %s: %s</text>`+"\n",
		tlLeft, c.Replicas, c.Jobs, c.TTL, c.OnStoreError, c.OnRenewFailure, onOff(c.Fencing), html.EscapeString(verdict))
}

// windows shades the fault windows across every row.
func (t *timeline) windows() {
	for _, wd := range t.h.Windows {
		col := faultColors[wd.Fault]
		x0, x1 := t.x(wd.Start), t.x(wd.End)
		title := html.EscapeString(fmt.Sprintf("%s %v–%v: %s", wd.Fault, fmtDur(wd.Start), fmtDur(wd.End), wd.Note))
		if x1-x0 < 2 {
			t.p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s" stroke-width="2" stroke-dasharray="4 3">`+
				`<title>%s</title></line>`+"\n", x0, tlTop-14, x0, tlTop+t.plotH, col, title)
		} else {
			t.p(`<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.13"><title>%s</title>`+
				`</rect>`+"\n", x0, tlTop-14, x1-x0, t.plotH+14, col, title)
		}
		t.p(`<text x="%.1f" y="%.0f" fill="%s" font-weight="bold">%s</text>`+"\n", x0+2, tlTop-18, col, wd.Fault)
	}
}

// rows draws the job rows and the time axis.
func (t *timeline) rows() {
	for j := range t.jobs {
		if j%2 == 1 {
			t.p(`<rect x="%.0f" y="%.1f" width="%.0f" height="%.0f" fill="#000" fill-opacity="0.03"/>`+"\n",
				tlLeft, t.y(j), tlPlotW, tlRowH)
		}
		if t.jobs <= 60 || j%5 == 0 {
			t.p(`<text x="%.0f" y="%.1f" text-anchor="end" fill="#444" font-size="10">%s</text>`+"\n",
				tlLeft-6, t.y(j)+tlRowH-3, jobKey(j)[len(keyPrefix):])
		}
	}
	t.p(`<text x="%.0f" y="%.0f" text-anchor="end" fill="#444" font-size="10">job</text>`+"\n", tlLeft-6, tlTop-4)
	step := tickStep(t.end)
	for d := time.Duration(0); d <= t.end; d += step {
		t.p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ccc" stroke-width="0.5"/>`+"\n",
			t.x(d), tlTop, t.x(d), tlTop+t.plotH)
		t.p(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="#444">%v</text>`+"\n", t.x(d), tlTop+t.plotH+14, d)
	}
}

// leases draws a bar per lease; overlapping leases of one job share its row
// in lanes.
func (t *timeline) leases() {
	lane, lanes := assignLanes(t.h.Sections)
	for i, s := range t.h.Sections {
		x0, x1 := t.x(s.Start), t.x(max(s.End, s.Start))
		if x1-x0 < 1.5 {
			x1 = x0 + 1.5
		}
		col := replicaColors[s.Replica%len(replicaColors)]
		op := "0.9"
		if s.Degraded {
			op = "0.35"
		}
		title := html.EscapeString(fmt.Sprintf("replica %d (process %d), job %d, fence %d%s: %v–%v, %s",
			s.Replica, s.Incarnation, s.Job, s.Fence, degradedNote(s.Degraded), fmtDur(s.Start), fmtDur(s.End),
			s.Outcome))
		bh := (tlRowH - 3) / float64(lanes[s.Job])
		if lanes[s.Job] == 1 {
			bh = tlBarH
		}
		by := t.y(s.Job) + (tlRowH-bh*float64(lanes[s.Job]))/2 + bh*float64(lane[i])
		t.p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%s"`, x0, by, x1-x0, bh, col, op)
		if s.Degraded {
			t.p(` stroke="%s" stroke-dasharray="3 2"`, col)
		}
		t.p(`><title>%s</title></rect>`+"\n", title)
		if s.PauseEnd > s.PauseStart {
			t.p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#hatch)"><title>paused %v</title></rect>`+
				"\n", t.x(s.PauseStart), by, t.x(s.PauseEnd)-t.x(s.PauseStart), bh, fmtDur(s.PauseEnd-s.PauseStart))
		}
		if s.Outcome == "crashed" {
			cross(&t.b, x1, t.y(s.Job)+tlRowH/2, 5, "#000", 2.2, "crashed without release")
		}
	}
}

// writes marks the writes: accepted as dots, rejected as red crosses, an
// accepted stale write circled in red.
func (t *timeline) writes() {
	ops := registerOps(t.h.Ops)
	stale := map[fencetest.Op]bool{}
	for _, s := range fencetest.StaleWrites(ops) {
		stale[s.Write] = true
	}
	for i, o := range t.h.Ops {
		if !o.Write {
			continue
		}
		cx, cy := t.x(o.Return), t.y(o.Job)+tlRowH/2
		if stale[ops[i]] {
			t.p(`<circle cx="%.1f" cy="%.1f" r="6" fill="none" stroke="#e00000" stroke-width="2"><title>STALE write `+
				`fence %d by replica %d accepted at %v</title></circle>`+"\n", cx, cy, o.Fence, o.Client, fmtDur(o.Return))
		}
		if o.Accepted {
			t.p(`<circle cx="%.1f" cy="%.1f" r="2.6" fill="#111"><title>write fence %d by replica %d accepted at %v`+
				`</title></circle>`+"\n", cx, cy, o.Fence, o.Client, fmtDur(o.Return))
		} else {
			cross(&t.b, cx, cy, 5, "#e00000", 2.6, fmt.Sprintf("write fence %d by replica %d rejected at %v",
				o.Fence, o.Client, fmtDur(o.Return)))
		}
	}
}

// legend explains the marks and lists the verdicts.
func (t *timeline) legend() {
	ly := tlTop + t.plotH + 36
	lx := tlLeft
	for i := range t.r.Config.Replicas {
		t.p(`<rect x="%.0f" y="%.0f" width="18" height="9" fill="%s" fill-opacity="0.9"/><text x="%.0f" y="%.0f">`+
			`replica %d</text>`+"\n", lx, ly-8, replicaColors[i%len(replicaColors)], lx+22, ly, i)
		lx += 86
	}
	t.p(`<rect x="%.0f" y="%.0f" width="18" height="9" fill="url(#hatch)"/><text x="%.0f" y="%.0f">paused holder`+
		`</text>`+"\n", lx, ly-8, lx+22, ly)
	lx += 106
	t.p(`<rect x="%.0f" y="%.0f" width="18" height="9" fill="#888" fill-opacity="0.35" stroke="#888" `+
		`stroke-dasharray="3 2"/><text x="%.0f" y="%.0f">degraded (fail-open)</text>`+"\n", lx, ly-8, lx+22, ly)
	lx += 140
	t.p(`<circle cx="%.0f" cy="%.0f" r="2.6" fill="#111"/><text x="%.0f" y="%.0f">write accepted</text>`+"\n",
		lx+6, ly-4, lx+14, ly)
	lx += 106
	cross(&t.b, lx+6, ly-4, 5, "#e00000", 2.6, "")
	t.p(`<text x="%.0f" y="%.0f">write rejected (stale)</text>`+"\n", lx+16, ly)
	lx += 150
	cross(&t.b, lx+6, ly-4, 5, "#000", 2.2, "")
	t.p(`<text x="%.0f" y="%.0f">crash</text>`+"\n", lx+16, ly)
	lx += 60
	t.p(`<circle cx="%.0f" cy="%.0f" r="6" fill="none" stroke="#e00000" stroke-width="2"/><text x="%.0f" y="%.0f">`+
		`stale write ACCEPTED</text>`+"\n", lx+6, ly-4, lx+16, ly)
	ly += 22
	var verdicts []string
	for _, iv := range t.r.Invariants {
		if iv.Verdict != Info {
			verdicts = append(verdicts, fmt.Sprintf("%s %s", iv.Verdict, iv.Name))
		}
	}
	for i := 0; i < len(verdicts); i += 4 {
		t.p(`<text x="%.0f" y="%.0f" fill="#333">%s</text>`+"\n", tlLeft, ly,
			html.EscapeString(strings.Join(verdicts[i:min(i+4, len(verdicts))], "  ·  ")))
		ly += 16
	}
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
