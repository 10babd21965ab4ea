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
)

// workerCommand returns the command line that starts one worker process:
// Config.WorkerCommand, or this program with the arguments sub.
func (c Config) workerCommand(sub ...string) ([]string, error) {
	if len(c.WorkerCommand) > 0 {
		return c.WorkerCommand, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: find this program to start worker processes: %v", ErrSetup, err)
	}
	return append([]string{exe}, sub...), nil
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
	stderr io.ReadCloser
	worker int           // index in History.Workers
	late   time.Duration // how late a call in flight at a kill may be applied
	exited chan struct{} // closed when its stdout ends
	s      *session      // what the worker has in flight and open

	wmu    sync.Mutex
	stdin  io.WriteCloser
	enc    *json.Encoder
	closed bool

	mu       sync.Mutex
	frozen   chan struct{} // non-nil while SIGSTOPped
	stops    int
	killed   bool
	killedAt time.Duration
	badMsg   error
	tail     []string // the last lines of its stderr

	handlers sync.WaitGroup // requests answered off the read loop
}

func (d *drill) startChild(r *replica, n int) (*child, error) {
	args, err := d.cfg.workerCommand("drill", "worker")
	if err != nil {
		return nil, err
	}
	rb, ok := d.be.(*redisBackend)
	if !ok {
		return nil, fmt.Errorf("%w: worker processes need Redis", ErrInvalidConfig)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = workerSysProcAttr()
	c := &child{d: d, r: r, n: n, cmd: cmd, late: rb.lateness(), exited: make(chan struct{})}
	if c.stdin, err = cmd.StdinPipe(); err == nil {
		if c.stdout, err = cmd.StdoutPipe(); err == nil {
			c.stderr, err = cmd.StderrPipe()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: worker pipes: %v", ErrSetup, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start worker process %s: %v", ErrSetup, args[0], err)
	}
	c.enc = json.NewEncoder(c.stdin)
	d.rec.count(func(h *History) {
		c.worker = len(h.Workers)
		h.Workers = append(h.Workers, Worker{Replica: r.id, Incarnation: n, PID: cmd.Process.Pid, Start: d.rec.since()})
	})
	hello := workerHello{Replica: r.id, Incarnation: n, T0: d.rec.t0.UnixNano(), Proxy: rb.proxy.Addr(),
		Prefix: rb.prefix, Late: c.late, Config: d.cfg}
	hello.Config.Store = rb.url
	c.send(hello)
	return c, nil
}

// serve runs the drill's side of one worker process until it exits: when
// ctx ends it is told to stop (its stdin closes) and killed if it does not
// within 2 × TTL + 3 s. It reaps the process and reports whether the crash
// fault killed it (then the replica restarts).
func (c *child) serve(ctx context.Context) (crashed bool) {
	d, r := c.d, c.r
	inc := &incarnation{n: c.n, proc: c, crash: make(chan struct{})}
	c.s = d.newSession(ctx, r, inc)
	r.mu.Lock()
	r.inc, r.working = inc, -1
	r.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(c.logStderr)
	wg.Go(func() {
		defer close(c.exited)
		c.readLoop()
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
	c.mu.Unlock()
	inflight, open := c.s.leftBehind()
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
	r.markWorking(-1, false)
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
			ErrSetup, r.id, c.cmd.Process.Pid, exit, c.stderrTail()))
	}
	return crashed
}

// readLoop handles the worker's messages in order until its stdout ends.
// Requests that wait (an ownership check, a pause) are answered off the
// loop, so the worker's other events keep flowing.
func (c *child) readLoop() {
	dec := json.NewDecoder(bufio.NewReader(c.stdout))
	for {
		var m wire
		err := dec.Decode(&m)
		if err == nil {
			err = c.handle(m)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			c.badMessage(err)
			_, _ = io.Copy(io.Discard, c.stdout)
		}
		return
	}
}

// handle passes one message of the worker to its session and sends the
// reply to a request. Requests that wait (an ownership check, a pause) are
// answered off the read loop, so the worker's other messages keep flowing.
func (c *child) handle(m wire) error {
	answer := func() error {
		reply, err := c.s.handle(m)
		if err == nil && !notices[m.K] {
			reply.K, reply.ID = "reply", m.ID
			c.send(reply)
		}
		return err
	}
	if m.K != "inspect" && m.K != "prewrite" {
		return answer()
	}
	c.handlers.Go(func() {
		if err := answer(); err != nil {
			c.badMessage(err)
		}
	})
	return nil
}

// badMessage kills a worker that broke the protocol; the drill fails.
func (c *child) badMessage(err error) {
	c.mu.Lock()
	if c.badMsg == nil {
		c.badMsg = err
	}
	c.mu.Unlock()
	c.kill()
}

// send writes one line (a wire message, or the hello) to the worker's stdin.
func (c *child) send(v any) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.closed {
		_ = c.enc.Encode(v) // a dead worker's pipe: nothing to tell it any more
	}
}

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

// paused: the worker is gone when it exits.
func (c *child) paused() (frozen, gone <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozen, c.exited
}

// logStderr sends each line of the worker's stderr to the drill's logger
// and keeps the last few for the error when the worker fails.
func (c *child) logStderr() {
	sc := bufio.NewScanner(c.stderr)
	for sc.Scan() {
		c.d.cfg.Logger.Warn("drill worker: "+sc.Text(), "replica", c.r.id, "incarnation", c.n)
		c.mu.Lock()
		c.tail = append(c.tail[max(0, len(c.tail)-7):], sc.Text())
		c.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, c.stderr) // a line too long for the scanner
}

func (c *child) stderrTail() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tail) == 0 {
		return "(nothing)"
	}
	return strings.Join(c.tail, "\n")
}
