package drill

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
)

// workerCommand returns the command line that starts one worker process.
func (c Config) workerCommand() ([]string, error) {
	if len(c.WorkerCommand) > 0 {
		return c.WorkerCommand, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: find this program to start worker processes: %v", ErrSetup, err)
	}
	return []string{exe, "drill", "worker"}, nil
}

// superviseProcesses runs r as a series of worker processes until ctx
// ends: a crash (SIGKILL) ends one and, after 2 × TTL, the next starts, as a
// restarted pod would. A worker that exits on its own is a failed drill.
func (d *drill) superviseProcesses(ctx context.Context, r *replica) {
	for n := 0; ctx.Err() == nil; n++ {
		c, err := d.startChild(r, n)
		if err != nil {
			d.fail(err)
			return
		}
		if !c.serve(ctx) || ctx.Err() != nil {
			return
		}
		if !sleep(ctx, 2*d.cfg.TTL) { // the process restarts
			return
		}
	}
}

// child is one worker process, seen from the drill: its pipes, what it has
// in flight, and its pause.
type child struct {
	d      *drill
	r      *replica
	n      int
	cmd    *exec.Cmd
	stdout io.ReadCloser
	stderr *tailWriter
	worker int           // index in History.Workers
	late   time.Duration // how late a call in flight at a kill may be applied
	obs    leasehold.Observer
	exited chan struct{} // closed when its stdout ends

	wmu    sync.Mutex
	stdin  io.WriteCloser
	enc    *json.Encoder
	closed bool

	mu       sync.Mutex
	inflight map[string][]time.Duration // token -> call times of store calls in flight
	open     map[int]openSection        // sections it opened and did not end
	frozen   chan struct{}              // non-nil while SIGSTOPped
	stops    int
	killed   bool
	killedAt time.Duration
	badMsg   error

	handlers sync.WaitGroup // requests answered off the read loop
}

type openSection struct{ key, token string }

func (d *drill) startChild(r *replica, n int) (*child, error) {
	args, err := d.cfg.workerCommand()
	if err != nil {
		return nil, err
	}
	rb, ok := d.be.(*redisBackend)
	if !ok {
		return nil, fmt.Errorf("%w: worker processes need Redis", ErrInvalidConfig)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = workerSysProcAttr()
	c := &child{d: d, r: r, n: n, cmd: cmd, late: rb.lateness(), obs: d.observer(), exited: make(chan struct{}),
		inflight: make(map[string][]time.Duration), open: make(map[int]openSection)}
	c.stderr = &tailWriter{log: func(line string) {
		d.cfg.Logger.Warn("drill worker: "+line, "replica", r.id, "incarnation", n)
	}}
	cmd.Stderr = c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("%w: worker stdin: %v", ErrSetup, err)
	}
	if c.stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, fmt.Errorf("%w: worker stdout: %v", ErrSetup, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start worker process %s: %v", ErrSetup, args[0], err)
	}
	c.enc = json.NewEncoder(c.stdin)
	d.rec.count(func(h *History) {
		c.worker = len(h.Workers)
		h.Workers = append(h.Workers, Worker{Replica: r.id, Incarnation: n, PID: cmd.Process.Pid, Start: d.rec.since()})
	})
	c.sendValue(workerHello{
		Replica: r.id, Incarnation: n, Jobs: d.cfg.Jobs, T0: d.rec.t0.UnixNano(),
		Store: rb.url, Proxy: rb.proxy.Addr(), Prefix: rb.prefix,
		TTL: d.cfg.TTL, WorkMin: d.cfg.WorkMin, WorkMax: d.cfg.WorkMax,
		OnStoreError: d.cfg.OnStoreError, OnRenewFailure: d.cfg.OnRenewFailure,
		Seed: d.cfg.Seed, Late: c.late,
	})
	return c, nil
}

// serve runs the drill's side of one worker process until it exits: when
// ctx ends it is told to stop (its stdin closes) and killed if it does not
// within 2 × TTL + 3 s. It reaps the process and reports whether the crash
// fault killed it (then the replica restarts).
func (c *child) serve(ctx context.Context) (crashed bool) {
	d, r := c.d, c.r
	inc := &incarnation{n: c.n, proc: c, crash: make(chan struct{})}
	r.mu.Lock()
	r.inc, r.working = inc, -1
	r.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(c.exited)
		c.readLoop(ctx, inc)
	})
	wg.Go(func() {
		for {
			select {
			case <-c.exited:
				return
			case job := <-r.hints:
				c.send(wire{K: "hint", Job: job})
			}
		}
	})
	select {
	case <-c.exited:
	case <-ctx.Done():
		c.closeStdin()
		c.thaw() // a paused worker must run to stop
		t := time.NewTimer(2*d.cfg.TTL + 3*time.Second)
		select {
		case <-c.exited:
			t.Stop()
		case <-t.C:
			c.kill()
		}
	}
	wg.Wait()
	c.handlers.Wait()
	c.closeStdin()
	waitErr := c.cmd.Wait()
	return c.finish(ctx, waitErr)
}

// finish closes what the worker left open. A killed worker's store calls in
// flight may still reach Redis (the request was sent): they count as
// applied, at the latest c.late after the kill; its open sections end at
// the kill, and the crash fault's victim gets a Stop for each.
func (c *child) finish(ctx context.Context, waitErr error) (crashed bool) {
	d, r := c.d, c.r
	c.mu.Lock()
	killed, at, badMsg := c.killed, c.killedAt, c.badMsg
	if !killed {
		at = d.rec.since()
	}
	inflight, open := c.inflight, c.open
	c.inflight, c.open = nil, nil
	c.mu.Unlock()
	for token, calls := range inflight {
		for _, call := range calls {
			d.rec.endAt(token, call, at, true, c.late)
		}
	}
	crashed = killed && ctx.Err() == nil
	for id, s := range open {
		if crashed {
			d.rec.stop(Stop{Fault: FaultCrash, Replica: r.id, Key: s.key, Token: s.token, At: at})
			d.endSection(id, at, "crashed", false)
		} else {
			d.endSection(id, at, "stopped", false)
		}
	}
	r.setWorking(-1, false)
	exit := "stopped"
	switch {
	case killed && crashed:
		exit = "killed (crash)"
	case killed:
		exit = "killed (did not stop in time)"
	case waitErr != nil:
		exit = waitErr.Error()
	}
	d.rec.count(func(h *History) {
		w := &h.Workers[c.worker]
		w.End, w.Exit, w.Stops = d.rec.since(), exit, c.stops
	})
	switch {
	case badMsg != nil:
		d.fail(fmt.Errorf("%w: worker process of replica %d: %v", ErrSetup, r.id, badMsg))
	case !killed && (waitErr != nil || ctx.Err() == nil):
		d.fail(fmt.Errorf("%w: worker process of replica %d (pid %d) exited on its own (%s); its stderr ends with: %s",
			ErrSetup, r.id, c.cmd.Process.Pid, exit, c.stderr.tail()))
	}
	return crashed
}

// readLoop handles the worker's messages in order until its stdout ends.
// Requests that wait (an ownership check, a pause) are answered off the
// loop, so the worker's other events keep flowing.
func (c *child) readLoop(ctx context.Context, inc *incarnation) {
	dec := json.NewDecoder(bufio.NewReader(c.stdout))
	for {
		var m wire
		err := dec.Decode(&m)
		if err == nil {
			err = c.handle(ctx, inc, m)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			c.mu.Lock()
			c.badMsg = err
			c.mu.Unlock()
			c.kill()
			_, _ = io.Copy(io.Discard, c.stdout)
		}
		return
	}
}

func (c *child) handle(ctx context.Context, inc *incarnation, m wire) error {
	d, r := c.d, c.r
	validJob := m.Job >= 0 && m.Job < d.cfg.Jobs
	reply := func(w wire) { w.K, w.ID = "reply", m.ID; c.send(w) }
	switch m.K {
	case "pick":
		job, finished := d.pickJob()
		reply(wire{Job: job, OK: finished})
	case "done":
		reply(wire{OK: !validJob || d.isDone(m.Job)})
	case "read":
		if !validJob || !c.owns(m.Sec) {
			return fmt.Errorf("read of job %d under section %d it does not hold", m.Job, m.Sec)
		}
		v, found := d.read(r.id, m.Job, m.Sec)
		reply(wire{Value: v, OK: found})
	case "write":
		if !validJob || !c.owns(m.Sec) {
			return fmt.Errorf("write of job %d under section %d it does not hold", m.Job, m.Sec)
		}
		reply(wire{OK: d.write(r.id, m.Job, m.Sec, m.Fence, m.Value)})
	case "open":
		if m.Section == nil {
			return errors.New("open without a section")
		}
		s := *m.Section
		s.Token, s.Replica, s.Incarnation = m.Token, r.id, c.n
		id := d.rec.openSection(s)
		c.mu.Lock()
		c.open[id] = openSection{key: s.Key, token: s.Token}
		c.mu.Unlock()
		reply(wire{Sec: id})
	case "end":
		c.mu.Lock()
		_, ok := c.open[m.Sec]
		delete(c.open, m.Sec)
		c.mu.Unlock()
		if ok {
			d.endSection(m.Sec, m.At, m.Text, m.OK)
		}
	case "stop":
		if m.Stop != nil {
			s := *m.Stop
			s.Token, s.Replica = m.Token, r.id
			d.rec.stop(s)
		}
	case "work":
		r.setWorking(m.Job, m.OK)
	case "begin":
		c.mu.Lock()
		c.inflight[m.Token] = append(c.inflight[m.Token], m.At)
		c.mu.Unlock()
		d.rec.begin(m.Token)
	case "ret":
		c.mu.Lock()
		calls := c.inflight[m.Token]
		for i, call := range calls {
			if call == m.Call {
				calls = append(calls[:i], calls[i+1:]...)
				break
			}
		}
		if len(calls) == 0 {
			delete(c.inflight, m.Token)
		} else {
			c.inflight[m.Token] = calls
		}
		c.mu.Unlock()
		d.rec.endAt(m.Token, m.Call, m.At, m.OK, m.Late)
	case "acq":
		d.rec.acquired(Acquisition{Key: m.Key, Token: m.Token, Fence: m.Fence, Replica: r.id, At: m.At})
	case "event":
		if m.Event != nil {
			c.obs.Observe(m.Event.event())
		}
	case "belief":
		if m.Belief != nil {
			b := *m.Belief
			b.Replica = r.id
			d.recordBelief(b)
		}
	case "inspect":
		c.handlers.Go(func() {
			ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.be.observeTimeout())
			info, err := d.be.observer().Inspect(ictx, m.Key)
			cancel()
			reply(wire{OK: err == nil || errors.Is(err, leasehold.ErrNotHeld), Flag: err == nil, Token: info.Token, Fence: info.Fence})
		})
	case "prewrite":
		if !c.owns(m.Sec) {
			return fmt.Errorf("prewrite under section %d it does not hold", m.Sec)
		}
		c.handlers.Go(func() {
			if r.takePause() {
				d.pause(ctx, r, inc, m.Job, m.Key, m.Token, m.Sec)
			}
			reply(wire{})
		})
	default:
		return fmt.Errorf("unknown message %q", m.K)
	}
	return nil
}

func (c *child) owns(sec int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.open[sec]
	return ok
}

func (c *child) sendValue(v any) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.closed {
		_ = c.enc.Encode(v) // a dead worker's pipe: nothing to tell it any more
	}
}

func (c *child) send(m wire) { c.sendValue(m) }

func (c *child) closeStdin() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.closed {
		c.closed = true
		_ = c.stdin.Close()
	}
}

// kill sends SIGKILL: the crash fault, or a worker that does not stop.
func (c *child) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed {
		return
	}
	c.killed = true
	_ = c.cmd.Process.Kill()
	c.killedAt = c.d.rec.since()
}

// freeze sends SIGSTOP: every goroutine of the worker stops, its renewals
// too, as in a GC or VM pause.
func (c *child) freeze() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen == nil && !c.killed {
		if err := stopProcess(c.cmd.Process); err == nil {
			c.frozen = make(chan struct{})
			c.stops++
		}
	}
}

// thaw sends SIGCONT to a frozen worker.
func (c *child) thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen != nil {
		_ = contProcess(c.cmd.Process)
		close(c.frozen)
		c.frozen = nil
	}
}

// waitThaw waits until the worker is thawed, exits, or ctx ends (then it
// thaws it).
func (c *child) waitThaw(ctx context.Context) {
	c.mu.Lock()
	frozen := c.frozen
	c.mu.Unlock()
	if frozen == nil {
		return
	}
	select {
	case <-frozen:
	case <-c.exited:
	case <-ctx.Done():
		c.thaw()
	}
}

// tailWriter is a worker's stderr: each line goes to the drill's logger, and
// the last few hundred bytes are kept for the error when a worker fails.
type tailWriter struct {
	log func(line string)

	mu   sync.Mutex
	line []byte
	last []byte
}

const tailSize = 1024

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last = append(t.last, p...)
	if len(t.last) > tailSize {
		t.last = t.last[len(t.last)-tailSize:]
	}
	t.line = append(t.line, p...)
	for {
		i := strings.IndexByte(string(t.line), '\n')
		if i < 0 {
			break
		}
		t.log(string(t.line[:i]))
		t.line = t.line[i+1:]
	}
	if len(t.line) > 4*tailSize { // no newline in sight: log it anyway
		t.log(string(t.line))
		t.line = t.line[:0]
	}
	return len(p), nil
}

func (t *tailWriter) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.last))
	if s == "" {
		return "(nothing)"
	}
	return s
}
