// Package contention measures one key contended by several replica
// processes, each with its own Locker and store client: acquisitions per
// replica, wait, hand-off between processes, store requests per acquisition
// and crash takeover after kill -9. With Config.Keys and Config.Lockers, a
// cell has several Lockers per process on several keys (each Locker takes
// the keys in turn), and fairness is over every Locker. 'leasehold bench --contention' runs it;
// the replicas are child processes ('leasehold bench-child', or the same
// child built from another commit or a peer library, see
// scripts/bench-contention.sh).
package contention

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Variant is one implementation under test: the command that starts one of
// its replicas (the child flags are appended).
type Variant struct {
	Name string
	Argv []string
	// Only, if set, names the one target the variant runs on (the peers
	// are Redis libraries).
	Only string
}

// Target is one store to run against. Count, when set, returns the number
// of requests the server has seen so far; what the replicas count on their
// clients is added to it (Redis: the clients count all but pub/sub
// commands, the server counts those).
type Target struct {
	Name  string
	URL   string
	Count func(ctx context.Context) (int64, error)
	// CountOverhead is subtracted from every delta of Count (the counting
	// query itself).
	CountOverhead int64
	// Server, when set, returns what the server has done so far: Redis,
	// the commands it ran (those inside scripts included) and its CPU time.
	Server func(ctx context.Context) (ServerStats, error)
}

// ServerStats are a server's cumulative counts (Target.Server).
type ServerStats struct {
	Commands int64
	CPU      time.Duration
}

// Config of a run.
type Config struct {
	Variants []Variant
	Targets  []Target
	Replicas int
	// Keys (default 1) is the number of keys of a contention cell and
	// Lockers (default 1) the Lockers of each replica process, each with
	// its own store client: Replicas × Lockers Lockers in all.
	Keys      int
	Lockers   int
	Hold      time.Duration
	Cell      time.Duration
	TTL       time.Duration
	Passes    int
	Takeovers int
	// Progress, if set, gets one line per finished cell.
	Progress io.Writer
}

// Cell is the result of one contention cell (one variant on one store).
type Cell struct {
	Pass         int
	Target       string
	Variant      string
	Acquisitions int
	PerReplica   []int // per Locker: replica r's Locker l at r×Lockers+l
	Requests     int64 // -1: not counted
	// ServerCommands and ServerCPU are what the server did during the
	// cell (Target.Server), -1 when not measured.
	ServerCommands int64
	ServerCPU      time.Duration
	WaitP50        time.Duration
	WaitP99        time.Duration
	HandoffP50     time.Duration
	HandoffP99     time.Duration
	Handoffs       int
	Reacquired     int
	Overlaps       int
	Errors         int
	FirstError     string
	TakeoverLags   []time.Duration
	TakeoverError  string
}

// RequestsPerAcq is the store requests per acquisition, or -1.
func (c Cell) RequestsPerAcq() float64 {
	if c.Requests < 0 || c.Acquisitions == 0 {
		return -1
	}
	return float64(c.Requests) / float64(c.Acquisitions)
}

// CommandsPerAcq is the server's commands per acquisition (those run inside
// scripts included), or -1.
func (c Cell) CommandsPerAcq() float64 {
	if c.ServerCommands < 0 || c.Acquisitions == 0 {
		return -1
	}
	return float64(c.ServerCommands) / float64(c.Acquisitions)
}

// CPUPer1000 is the server's CPU time per 1000 acquisitions, in ms, or -1.
func (c Cell) CPUPer1000() float64 {
	if c.ServerCPU < 0 || c.Acquisitions == 0 {
		return -1
	}
	return float64(c.ServerCPU) / float64(time.Millisecond) * 1000 / float64(c.Acquisitions)
}

// Fairness is min/max acquisitions per Locker.
func (c Cell) Fairness() float64 {
	if len(c.PerReplica) == 0 || slices.Max(c.PerReplica) == 0 {
		return 0
	}
	return float64(slices.Min(c.PerReplica)) / float64(slices.Max(c.PerReplica))
}

// Run runs cfg.Passes passes; in each, every target runs every variant
// (the variant order alternates between passes), first the contention
// cell, then the takeover cell.
func Run(ctx context.Context, cfg Config) ([]Cell, error) {
	var cells []Cell
	for p := 1; p <= cfg.Passes; p++ {
		for _, t := range cfg.Targets {
			vs := slices.Clone(cfg.Variants)
			if p%2 == 0 {
				slices.Reverse(vs)
			}
			for _, v := range vs {
				if v.Only != "" && v.Only != t.Name {
					continue
				}
				c, err := runLoop(ctx, cfg, v, t)
				if err != nil {
					return cells, fmt.Errorf("pass %d, %s, %s: %w", p, t.Name, v.Name, err)
				}
				c.Pass = p
				if cfg.Takeovers > 0 {
					c.TakeoverLags, err = runCrash(ctx, cfg, v, t)
					if err != nil {
						c.TakeoverError = err.Error()
					}
				}
				cells = append(cells, c)
				if cfg.Progress != nil {
					fmt.Fprintln(cfg.Progress, c.String())
				}
			}
		}
	}
	return cells, nil
}

func (c Cell) String() string {
	per := fmt.Sprint(c.PerReplica)
	if len(c.PerReplica) > 16 {
		per = fmt.Sprintf("%d Lockers, min %d max %d", len(c.PerReplica), slices.Min(c.PerReplica), slices.Max(c.PerReplica))
	}
	return fmt.Sprintf("pass %d %-8s %-10s acq %5d  req/acq %5.2f  server cmds/acq %5.2f  server CPU %.1f ms/1000 acq  per Locker %s (%.2f)  wait p50 %v p99 %v  hand-off p50 %v p99 %v (%d, reacquired %d)  takeover %v  overlaps %d  errors %d %s%s",
		c.Pass, c.Target, c.Variant, c.Acquisitions, c.RequestsPerAcq(), c.CommandsPerAcq(), c.CPUPer1000(), per, c.Fairness(),
		us(c.WaitP50), us(c.WaitP99), us(c.HandoffP50), us(c.HandoffP99), c.Handoffs, c.Reacquired,
		usList(c.TakeoverLags), c.Overlaps, c.Errors, c.FirstError, c.TakeoverError)
}

func us(d time.Duration) string { return d.Round(time.Microsecond).String() }

func usList(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = us(d)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func randomKey(kind string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "leasehold-bench:contention:" + kind + ":" + hex.EncodeToString(b)
}

// child is one replica process.
type child struct {
	idx   int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // closed at EOF
	err   bytes.Buffer
}

type line struct {
	idx  int
	text string
}

// start runs one replica with args. The store URL, password included,
// reaches it on stdin ("-store -"), never in its argv, which every user of
// the host can read (ps, /proc/PID/cmdline).
func start(v Variant, idx int, args []string, url string, merged chan<- line) (*child, error) {
	argv := append(slices.Clone(v.Argv[1:]), args...)
	cmd := exec.Command(v.Argv[0], argv...)
	c := &child{idx: idx, cmd: cmd, lines: make(chan string, 1024)}
	cmd.Stderr = &c.err
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c.stdin, url+"\n"); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	go func() { // ends at the child's EOF; the child is always killed or waited
		s := bufio.NewScanner(out)
		s.Buffer(make([]byte, 1<<16), 1<<20)
		for s.Scan() {
			if merged != nil {
				merged <- line{idx, s.Text()}
			} else {
				c.lines <- s.Text()
			}
		}
		if merged != nil {
			merged <- line{idx, ""}
		}
		close(c.lines)
	}()
	return c, nil
}

func (c *child) ready(lines <-chan string) error {
	select {
	case l, ok := <-lines:
		if !ok || l != "ready" {
			return fmt.Errorf("replica %d did not start: %q %s", c.idx, l, tail(c.err.String()))
		}
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("replica %d: no ready line in 60 s", c.idx)
	}
}

func tail(s string) string {
	if len(s) > 400 {
		return s[len(s)-400:]
	}
	return s
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

func childArgs(cfg Config, t Target, key, mode string) []string {
	args := []string{"-store", "-", "-key", key, "-mode", mode, "-hold", cfg.Hold.String(), "-ttl", cfg.TTL.String()}
	if mode == "loop" && (cfg.Keys > 1 || cfg.Lockers > 1) { // a replica of an older build knows neither flag
		args = append(args, "-keys", strconv.Itoa(max(cfg.Keys, 1)), "-lockers", strconv.Itoa(max(cfg.Lockers, 1)))
	}
	return args
}

type event struct {
	replica        int // the Locker: replica×Lockers + its Locker
	key            int
	call, got, rel int64
}

func runLoop(ctx context.Context, cfg Config, v Variant, t Target) (Cell, error) {
	key := randomKey("loop")
	kids := make([]*child, cfg.Replicas)
	defer func() {
		for _, k := range kids {
			if k != nil {
				k.kill()
			}
		}
	}()
	if err := startReady(kids, v, childArgs(cfg, t, key, "loop"), t.URL); err != nil {
		return Cell{}, err
	}
	var before int64
	if t.Count != nil {
		var err error
		if before, err = t.Count(ctx); err != nil {
			return Cell{}, fmt.Errorf("counting requests: %w", err)
		}
	}
	var server ServerStats
	if t.Server != nil {
		var err error
		if server, err = t.Server(ctx); err != nil {
			return Cell{}, fmt.Errorf("reading the server's stats: %w", err)
		}
	}
	st := Mono() + int64(20*time.Millisecond)
	goLine := fmt.Sprintf("go %d %d\n", st, st+int64(cfg.Cell))
	for _, k := range kids {
		if _, err := io.WriteString(k.stdin, goLine); err != nil {
			return Cell{}, err
		}
	}
	lockers := max(cfg.Lockers, 1)
	c := Cell{Target: t.Name, Variant: v.Name, PerReplica: make([]int, cfg.Replicas*lockers), Requests: -1, ServerCommands: -1, ServerCPU: -1}
	o := output{lockers: lockers}
	for _, k := range kids {
		for l := range k.lines {
			o.parse(k.idx, l)
		}
		if err := k.cmd.Wait(); err != nil {
			return Cell{}, fmt.Errorf("replica %d: %w %s", k.idx, err, tail(k.err.String()))
		}
		kids[k.idx] = nil
	}
	c.Errors, c.FirstError = o.errors, o.firstError
	if t.Count != nil {
		after, err := t.Count(ctx)
		if err != nil {
			return Cell{}, fmt.Errorf("counting requests: %w", err)
		}
		c.Requests = after - before - t.CountOverhead
	}
	if t.Server != nil {
		after, err := t.Server(ctx)
		if err != nil {
			return Cell{}, fmt.Errorf("reading the server's stats: %w", err)
		}
		c.ServerCommands, c.ServerCPU = after.Commands-server.Commands, after.CPU-server.CPU
	}
	if o.counted { // the replicas' own counts add to the server's
		c.Requests = max(c.Requests, 0) + o.requests
	}
	summarize(&c, o.events)
	return c, nil
}

// startReady starts len(kids) replicas and waits for each to be ready.
func startReady(kids []*child, v Variant, args []string, url string) error {
	for i := range kids {
		k, err := start(v, i, args, url, nil)
		if err != nil {
			return err
		}
		kids[i] = k
	}
	for _, k := range kids {
		if err := k.ready(k.lines); err != nil {
			return err
		}
	}
	return nil
}

// output is what the replicas of a loop cell printed.
type output struct {
	lockers    int // per replica
	events     []event
	requests   int64
	counted    bool
	errors     int
	firstError string
}

func (o *output) parse(replica int, l string) {
	f := strings.Fields(l)
	switch {
	case (len(f) == 4 || len(f) == 6) && f[0] == "e":
		e := event{replica: replica * max(o.lockers, 1)}
		e.call, _ = strconv.ParseInt(f[1], 10, 64)
		e.got, _ = strconv.ParseInt(f[2], 10, 64)
		e.rel, _ = strconv.ParseInt(f[3], 10, 64)
		if len(f) == 6 {
			l, _ := strconv.Atoi(f[4])
			e.replica += l
			e.key, _ = strconv.Atoi(f[5])
		}
		o.events = append(o.events, e)
	case len(f) == 2 && f[0] == "rt":
		n, _ := strconv.ParseInt(f[1], 10, 64)
		o.requests += n
		o.counted = true
	case len(f) >= 2 && f[0] == "errors":
		n, _ := strconv.Atoi(f[1])
		o.errors += n
		if o.firstError == "" && len(f) > 2 {
			o.firstError = strings.Join(f[2:], " ")
		}
	}
}

// summarize fills c from the acquisitions evs; hand-offs, re-acquisitions
// and overlaps are between consecutive holders of the same key.
func summarize(c *Cell, evs []event) {
	c.Acquisitions = len(evs)
	slices.SortFunc(evs, func(a, b event) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return int(a.got - b.got)
	})
	var waits, hand []time.Duration
	for i, e := range evs {
		c.PerReplica[e.replica]++
		waits = append(waits, time.Duration(e.got-e.call))
		if i == 0 || evs[i-1].key != e.key {
			continue
		}
		p := evs[i-1]
		switch {
		case e.got < p.rel:
			c.Overlaps++
		case e.replica == p.replica:
			c.Reacquired++
		default:
			hand = append(hand, time.Duration(e.got-p.rel))
		}
	}
	c.Handoffs = len(hand)
	c.WaitP50, c.WaitP99 = pct(waits, 50), pct(waits, 99)
	c.HandoffP50, c.HandoffP99 = pct(hand, 50), pct(hand, 99)
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(p/100*float64(len(ds))+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// runCrash starts the replicas in crash mode: whoever gets the key reports
// it and holds it; the parent kills it with SIGKILL at once and starts a
// replacement. The lag of each takeover is the next holder's acquire
// returning minus (the killed holder's acquire returning + TTL), which is
// at or after the key's expiry on the store, so the lag is slightly
// understated (by the killed holder's acquire response time).
func runCrash(ctx context.Context, cfg Config, v Variant, t Target) ([]time.Duration, error) {
	r := &crashRun{cfg: cfg, v: v, t: t, key: randomKey("crash"), merged: make(chan line, 1024),
		kids: map[int]*child{}, end: Mono() + int64(time.Minute)}
	defer r.stop()
	for range cfg.Replicas {
		if err := r.spawn(); err != nil {
			return nil, err
		}
	}
	deadline := time.After(time.Duration(cfg.Takeovers+2) * (cfg.TTL + 10*time.Second))
	for len(r.lags) < cfg.Takeovers {
		select {
		case l := <-r.merged:
			if err := r.handle(l); err != nil {
				return r.lags, err
			}
		case <-deadline:
			return r.lags, errors.New("takeover cell timed out")
		case <-ctx.Done():
			return r.lags, ctx.Err()
		}
	}
	return r.lags, nil
}

// crashRun is the state of one takeover cell.
type crashRun struct {
	cfg     Config
	v       Variant
	t       Target
	key     string
	merged  chan line
	kids    map[int]*child
	next    int
	end     int64
	prevGot int64
	lags    []time.Duration
}

func (r *crashRun) spawn() error {
	k, err := start(r.v, r.next, childArgs(r.cfg, r.t, r.key, "crash"), r.t.URL, r.merged)
	if err != nil {
		return err
	}
	r.kids[r.next] = k
	r.next++
	return nil
}

// handle is one line of a replica: ready (start it), got (record the lag,
// kill it, start a replacement) or EOF.
func (r *crashRun) handle(l line) error {
	k := r.kids[l.idx]
	f := strings.Fields(l.text)
	switch {
	case k == nil: // already killed
		return nil
	case l.text == "ready":
		_, err := fmt.Fprintf(k.stdin, "go %d %d\n", Mono(), r.end)
		return err
	case len(f) == 3 && f[0] == "got":
		got, _ := strconv.ParseInt(f[2], 10, 64)
		k.kill()
		delete(r.kids, l.idx)
		if r.prevGot != 0 {
			r.lags = append(r.lags, time.Duration(got-r.prevGot-int64(r.cfg.TTL)))
		}
		r.prevGot = got
		return r.spawn()
	case l.text == "":
		return fmt.Errorf("replica %d exited: %s", l.idx, tail(k.err.String()))
	}
	return nil
}

// stop kills every replica and drains their output until it goes quiet, so
// that the reader goroutines finish.
func (r *crashRun) stop() {
	for _, k := range r.kids {
		k.kill()
	}
	for {
		select {
		case <-r.merged:
		case <-time.After(100 * time.Millisecond):
			return
		}
	}
}
