package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasehold/leasehold"
)

// The command of run and elect never outlives the leasehold process that
// holds its lease, nor that lease. leasehold starts itself again as a
// supervisor between it and the command:
//
//	leasehold run ── leasehold __supervise ── COMMAND (own process group) ── …
//
// The supervisor starts the command, reports its pid on fd 3, and exits with
// the command's status (128+N when signal N ended it). When its parent dies,
// whatever the reason (SIGKILL and the OOM killer included), it kills the
// command's whole process group with SIGKILL (only the command itself when
// the command shares the terminal's foreground group), waits for it, and
// exits. It learns of the death at once from parentDeathSignal
// (PR_SET_PDEATHSIG, Linux only) and from the end of file of fd 4, and
// within superviseCheck from polling its parent pid. The lease can only
// expire a TTL after the last renewal, well after either.
//
// Its parent may also live but not run (SIGSTOP, a debugger, a frozen
// cgroup): then nothing in it sees the lease's local guard pass. So the
// parent tells the supervisor the guard (Lease.ValidUntil) as an instant of
// CLOCK_MONOTONIC, the one clock of every process of the machine: in its
// arguments, and on fd 4 (one decimal line of nanoseconds) after every
// renewal. When the last guard it heard of passes, the supervisor kills the
// command the same way, SIGKILL at once: its parent is not there to send
// SIGTERM and wait a grace. An instant, unlike a duration, stays true
// however late it is read. No guard ("-": a degraded lease, without a
// lock) is no deadline.

// superviseArg, as leasehold's first argument, makes it the supervisor.
// Not a command users type: it is not in the help.
const superviseArg = "__supervise"

// superviseCheck is how often the supervisor checks that its parent lives.
const superviseCheck = 100 * time.Millisecond

// Process group modes of the supervised command.
const (
	modeGroup = "group" // its own process group: signals reach every process of it
	modeFg    = "fg"    // the terminal's foreground group: signals reach the command alone
)

// IsSupervisor reports whether args (without the program name) start the
// supervisor; SuperviseMain runs it.
func IsSupervisor(args []string) bool { return len(args) > 0 && args[0] == superviseArg }

// SuperviseMain is the supervisor: args are superviseArg, the parent's pid,
// the mode, the guard (nanoseconds of CLOCK_MONOTONIC, or "-") and the
// command. It returns the exit status.
func SuperviseMain(args []string) int {
	var ppid int
	if len(args) >= 5 {
		ppid, _ = strconv.Atoi(args[1])
	}
	if ppid <= 0 {
		fmt.Fprintln(os.Stderr, "leasehold: __supervise is internal to run and elect")
		return ExitUsage
	}
	group, argv := args[2] == modeGroup, args[4:]
	report, guards := os.NewFile(3, "report"), os.NewFile(4, "guards")
	unix.CloseOnExec(3)
	unix.CloseOnExec(4)

	died := make(chan os.Signal, 1)
	signal.Notify(died, parentDeathSignal)
	// The command's signals come from its leasehold parent; the ones the
	// terminal sends to its whole foreground group must not end the
	// supervisor (a handler, not SIG_IGN, which the command would inherit).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if os.Getppid() != ppid {
		return ExitFailure // the parent is gone already: start nothing
	}

	// The command gets SIGKILL should this process die: the thread that
	// starts it stays locked to this goroutine until it was waited for.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.SysProcAttr = commandAttr(group)
	if err := child.Start(); err != nil {
		code := ExitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = ExitNotFound
		}
		fmt.Fprintf(report, "E %d %s\n", code, err)
		return code
	}
	pid := child.Process.Pid
	fmt.Fprintf(report, "%d\n", pid)
	_ = report.Close()

	kill := func() {
		if group {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		} else {
			_ = child.Process.Kill()
		}
	}

	waited := make(chan error, 1)
	go func() { waited <- child.Wait() }() // joined below on every path
	guard := make(chan time.Duration)
	go readGuards(guards, guard) // ends at the parent's death
	expiry := time.NewTimer(0)
	expiry.Stop()
	if at, err := strconv.ParseInt(args[3], 10, 64); err == nil {
		expiry.Reset(time.Duration(at) - monotime())
	}
	tick := time.NewTicker(superviseCheck)
	defer tick.Stop()
	for {
		select {
		case err := <-waited:
			return exitCode(err)
		case at, ok := <-guard:
			if ok {
				expiry.Reset(at - monotime())
				continue
			}
			guard = nil // end of file: the parent is gone
		case <-expiry.C:
			fmt.Fprintf(os.Stderr, "leasehold: the lease's local guard passed and leasehold (pid %d) had not stopped the command (is it stopped or frozen?): sending SIGKILL to pid %d\n", ppid, pid)
			kill()
			return exitCode(<-waited)
		case <-died:
		case <-tick.C:
		}
		if guard != nil && os.Getppid() == ppid {
			continue // a stray signal, not the parent's death
		}
		kill()
		<-waited
		return ExitLeaseLost
	}
}

// readGuards sends on c each guard read from f, and closes c at its end.
func readGuards(f *os.File, c chan<- time.Duration) {
	defer close(c)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if at, err := strconv.ParseInt(sc.Text(), 10, 64); err == nil {
			c <- time.Duration(at)
		}
	}
}

// monotime reads CLOCK_MONOTONIC, which every process of the machine shares
// (Go's own monotonic readings count from each process's start).
func monotime() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// guardAt is the lease's local guard as an instant of monotime, "-" when the
// lease has none. monotime is read first: a pause between the two readings
// makes the instant earlier, never later.
func guardAt(lease *leasehold.Lease) string {
	now := monotime()
	until := lease.ValidUntil()
	if until.IsZero() {
		return "-"
	}
	return strconv.FormatInt(int64(now+time.Until(until)), 10)
}

// guardPassed reports whether lease's local guard has passed: the
// supervisor may have killed the command for it before the lease noticed.
func guardPassed(lease *leasehold.Lease) bool {
	until := lease.ValidUntil()
	return !until.IsZero() && !time.Now().Before(until)
}

// renewals is an Observer that pokes its channel (without blocking) after
// every renewal, for startSupervised to tell the supervisor the new guard.
type renewals chan struct{}

// Observe pokes r on EventRenewed.
func (r renewals) Observe(e leasehold.Event) {
	if e.Kind == leasehold.EventRenewed {
		select {
		case r <- struct{}{}:
		default:
		}
	}
}

// supervised is a command started under a supervisor.
type supervised struct {
	pid   int  // the command's pid; its process group's id when group
	group bool // the command has a process group of its own
	// done receives the supervisor's end (its status is the command's),
	// once; the goroutine that sends it has then ended.
	done chan error
}

// startError is a command the supervisor could not start.
type startError struct {
	code int // ExitNotFound or ExitCannotExec
	msg  string
}

func (e *startError) Error() string { return e.msg }

// startSupervised starts args under a supervisor (see SuperviseMain) with
// env, on this process's stdin, stdout and stderr, and tells it lease's
// guard at the start and after each poke of renewed. With group the command
// gets a process group of its own. A command that cannot be started returns
// a *startError.
func startSupervised(args, env []string, group bool, lease *leasehold.Lease, renewed <-chan struct{}) (*supervised, error) {
	self, err := selfExecutable()
	if err != nil {
		return nil, &startError{code: ExitCannotExec, msg: fmt.Sprintf("cannot find leasehold's own executable to supervise the command: %v", err)}
	}
	mode := modeFg
	if group {
		mode = modeGroup
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, &startError{code: ExitCannotExec, msg: err.Error()}
	}
	defer r.Close()
	gr, gw, err := os.Pipe()
	if err != nil {
		_ = w.Close()
		return nil, &startError{code: ExitCannotExec, msg: err.Error()}
	}
	sup := exec.Command(self, append([]string{superviseArg, strconv.Itoa(os.Getpid()), mode, guardAt(lease)}, args...)...)
	sup.Args[0] = os.Args[0]
	sup.Stdin, sup.Stdout, sup.Stderr = os.Stdin, os.Stdout, os.Stderr
	sup.Env = env
	sup.ExtraFiles = []*os.File{w, gr}
	// With group, the supervisor leaves this process's group too: a SIGKILL
	// to that group (timeout -s KILL, kill -9 %job) must not take it along
	// before it killed the command's group. On a terminal it stays in the
	// foreground group, which the command shares.
	sup.SysProcAttr = supervisorAttr(group)
	s := &supervised{group: group, done: make(chan error, 1)}
	started, ended := make(chan error, 1), make(chan struct{})
	go func() {
		// The parent-death signal follows the thread that forks, not the
		// process: keep that thread until the supervisor ended.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := sup.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := sup.Wait()
		close(ended)
		s.done <- err
	}()
	err = <-started
	_, _ = w.Close(), gr.Close()
	if err != nil {
		_ = gw.Close()
		return nil, &startError{code: ExitCannotExec, msg: err.Error()}
	}
	go func() { // gw stays open while the supervisor lives: its end of file is this process's death
		defer gw.Close()
		for {
			select {
			case <-renewed:
				fmt.Fprintln(gw, guardAt(lease))
			case <-ended:
				return
			}
		}
	}()
	line, _ := io.ReadAll(r)
	msg := strings.TrimSpace(string(line))
	if s.pid, err = strconv.Atoi(msg); err == nil {
		return s, nil
	}
	<-s.done
	if rest, ok := strings.CutPrefix(msg, "E "); ok {
		code, text, _ := strings.Cut(rest, " ")
		n, _ := strconv.Atoi(code)
		return nil, &startError{code: n, msg: text}
	}
	return nil, &startError{code: ExitCannotExec, msg: "the supervisor ended before it started the command"}
}

// signal sends s to the command (to its whole group with a group).
func (s *supervised) signal(sig syscall.Signal) {
	if s.group {
		_ = syscall.Kill(-s.pid, sig)
	} else {
		_ = syscall.Kill(s.pid, sig)
	}
}

// ended handles the supervisor's end: when the supervisor itself was killed
// (not the command), the command may still run, so it gets SIGKILL. It
// returns the command's status.
func (s *supervised) ended(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			s.signal(syscall.SIGKILL)
		}
	}
	return exitCode(err)
}
