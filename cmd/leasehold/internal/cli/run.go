package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
)

type runOpts struct {
	key          string
	ttl          time.Duration
	wait         time.Duration
	nonblock     bool // -n: --wait 0, said explicitly
	renewEvery   time.Duration
	renewTimeout time.Duration
	maxFailures  int
	maxHold      time.Duration
	onStoreError string
	grace        time.Duration
	metricsAddr  string
	name         string
	report       runReport
	conflictCode int    // exit status when another owner holds the key
	command      string // -c: a command line for sh -c
	keepStore    bool   // keep LEASEHOLD_STORE in the child's environment
	quiet        bool
	limit        int
}

// Environment variables run gives the child.
const (
	EnvKey      = "LEASEHOLD_KEY"
	EnvToken    = "LEASEHOLD_TOKEN"
	EnvFence    = "LEASEHOLD_FENCE"
	EnvDegraded = "LEASEHOLD_DEGRADED"
)

func (a *App) runCmd() *cobra.Command {
	var o runOpts
	cmd := &cobra.Command{
		Use:   "run --key KEY [flags] [-- COMMAND [ARG...] | -c 'COMMAND LINE']",
		Short: "Run a command under a lease, renewing it; stop the command if the lease is lost",
		Long: `run acquires a lease on --key, starts COMMAND, keeps the lease renewed while
COMMAND runs and releases it when COMMAND exits: flock(1) across machines.

With --wait 0 (the default; -n says so explicitly) run makes one attempt;
otherwise it waits up to --wait (seconds as flock's -w takes them, 5 or 0.5,
or a duration such as 1m30s) for the holder to release or expire. The lease
is renewed every --renew-every (default TTL/3); after --max-renew-failures
consecutive failed renewals, or when the lease's own clock says the TTL ran
out, or when the store says another owner has the key, the lease has ended:
run logs why, sends SIGTERM to COMMAND, then SIGKILL after --grace (sooner
when the lock would expire in the store first: the next holder never runs
beside COMMAND), and exits 79. When stdin is not a terminal COMMAND runs in its own process group, and
the signals reach the whole group.

COMMAND never outlives run: a small supervisor process between them kills
COMMAND's whole process group when run dies for any reason, SIGKILL included,
long before the lease could expire in the store. Nor does it outlive the
lease when run lives but does not run (SIGSTOP, a debugger, a frozen cgroup):
the supervisor knows the lease's local guard, renewed with it, and when the
guard passes without a renewal it sends SIGKILL to the group at once (no
SIGTERM, no --grace: run is not there to wait).

SIGINT, SIGTERM and SIGHUP sent to run are forwarded to COMMAND.

-c 'COMMAND LINE' runs the line through sh -c (flock's -c). With no command at
all run holds the lock: it prints the lease, keeps it renewed until SIGINT or
SIGTERM, releases it and exits 0 (79 if the lease ends first).

While it waits (--wait) run prints a line on stderr every few seconds: who
holds the key, how many wait, when it expires (--quiet: silent). With --json it
prints one result object on stdout when it ends: key, outcome, exit_code,
fence, token_prefix, holder, waited_ms, held_ms, child_exit_code, and the cause
when the lease ended early.

When the lease ends early run says why: lost to another owner (naming it),
released in the store by someone else (an operator's release), abandoned after
N failed renewals, expired locally, or --max-hold reached.

The store must be shared between processes (redis://, rediss://, etcd://,
postgres://); the memory store is refused. LEASEHOLD_STORE is removed from
COMMAND's environment (it may hold a password) unless --keep-store-env.

COMMAND sees these environment variables:
  LEASEHOLD_KEY       the key
  LEASEHOLD_TOKEN     the owner token of this acquisition
  LEASEHOLD_FENCE     the fence token: pass it to the storage you write to so
                      writes of a stale holder are rejected (0 when degraded)
  LEASEHOLD_DEGRADED  "1" when the store was unreachable and
                      --on-store-error fail-open ran COMMAND without a lock:
                      other replicas may run the same work

Exit status:
  COMMAND's own status (128+N when signal N ended it)
  75   not acquired within --wait (another owner held the key; see
       --conflict-exit-code)
  69   the store was unavailable and --on-store-error is fail-closed:
       COMMAND did not run
  77   the store refused the credentials or permissions: COMMAND did not
       run, also under fail-open
  78   other store configuration (TLS, protocol, schema, an error not known
       to be an outage): COMMAND did not run, also under fail-open
  79   the lease ended while COMMAND ran (lost to another owner, released by
       someone else, abandoned, expired locally, --max-hold reached: the
       message says which; COMMAND was stopped), or at release another owner
       had the key
  126/127  COMMAND could not be executed / was not found
  2    bad usage
  128+N  run itself was interrupted by signal N while waiting`,
		Example: `  leasehold run --store redis://127.0.0.1:6379 --key nightly-report --wait 1m -- ./report.sh
  LEASEHOLD_STORE=redis://redis:6379 leasehold run --key job:42 --ttl 60s -- sh -c 'echo fence $LEASEHOLD_FENCE'`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch dash := cmd.ArgsLenAtDash(); {
			case dash > 0:
				return usage("arguments before --: %q; put the whole command after --, e.g. leasehold run --key K -- %s", args[:dash], strings.Join(args, " "))
			case dash == 0 && len(args) == 0: // -- "$JOB" with JOB unset: not the hold mode
				return usage("no command after --; leave out -- to hold the lock without a command")
			}
			if cmd.Flags().Changed("command") && len(args) > 0 {
				return usage("give the command either after -- or with -c, not both")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			res := &runResult{Key: o.key}
			err := res.emit(a, a.run(cmd, &o, args, res))
			return o.report.finish(a, err, res.Outcome)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.key, "key", "", "lock key (required), e.g. scheduler:job:42")
	f.DurationVar(&o.ttl, "ttl", 30*time.Second, "lease time to live; > 0")
	f.VarP((*secondsOrDuration)(&o.wait), "wait", "w", "how long to wait for the lock, in seconds (5, 0.5) or as a duration (1m30s); 0 = one attempt (flock's -w)")
	f.BoolVarP(&o.nonblock, "nonblock", "n", false, "one attempt, do not wait: the same as --wait 0 (flock's -n)")
	f.DurationVar(&o.renewEvery, "renew-every", 0, "renewal interval (default TTL/3); < --ttl")
	f.DurationVar(&o.renewTimeout, "renew-timeout", 0, "bound on each renewal attempt (default: the library's, which fits the failure budget, at most 2s); < --ttl")
	f.IntVar(&o.maxFailures, "max-renew-failures", leasehold.DefaultMaxRenewFailures, "consecutive failed renewals after which the lease is abandoned; >= 1")
	f.DurationVar(&o.maxHold, "max-hold", 0, "stop renewing (and stop COMMAND, exit 79) after this long; 0 = no cap")
	f.StringVar(&o.onStoreError, "on-store-error", "fail-closed", "when the store is unreachable at acquire: fail-closed (exit 69) or fail-open (run with LEASEHOLD_DEGRADED=1); a misconfigured store always fails closed (77, 78)")
	f.DurationVar(&o.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the lease ends (at most until the lock would expire in the store)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9464")
	f.StringVar(&o.name, "name", "run", "locker name: the locker label of metrics and logs")
	f.IntVarP(&o.conflictCode, "conflict-exit-code", "E", ExitNotAcquired, "exit status when another owner holds the key (flock's -E)")
	f.StringVarP(&o.command, "command", "c", "", "run this command line through sh -c")
	f.BoolVar(&o.keepStore, "keep-store-env", false, "keep "+EnvStore+" (it may hold a password) in the command's environment")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "no waiting lines on stderr")
	addReportFlags(f, &o.report)
	f.IntVar(&o.limit, "limit", 0, "run as one of at most N holders of the key (a semaphore of N permits, like consul lock -n; every run of the key must pass the same N); 0 = a plain lock")
	return cmd
}

func (o *runOpts) validate(cmd *cobra.Command) (leasehold.StorePolicy, error) {
	if !cmd.Flags().Changed("key") {
		return 0, usage("missing --key: the lock key, e.g. --key scheduler:job:42")
	}
	if err := leasehold.ValidateKey(o.key); err != nil {
		return 0, usage("--key: %v", err)
	}
	switch {
	case o.ttl <= 0:
		return 0, usage("--ttl must be > 0, got %v", o.ttl)
	case o.wait < 0:
		return 0, usage("--wait must be >= 0, got %v", o.wait)
	case o.nonblock && o.wait > 0:
		return 0, usage("-n/--nonblock means --wait 0; pass one of -n and --wait %v, not both", o.wait)
	case o.limit < 0:
		return 0, usage("--limit must be >= 1 (or 0 for a plain lock), got %d", o.limit)
	case o.renewEvery < 0:
		return 0, usage("--renew-every must be > 0, got %v", o.renewEvery)
	case o.renewEvery == 0 && o.ttl > 0 && o.ttl/3 < leasehold.MinRenewInterval:
		return 0, usage("--ttl %v is too short: the lease renews every TTL/3, at least every %v, so --ttl must be at least %v", o.ttl, leasehold.MinRenewInterval, 3*leasehold.MinRenewInterval)
	case o.renewEvery >= o.ttl:
		return 0, usage("--renew-every (%v) must be shorter than --ttl (%v)", o.renewEvery, o.ttl)
	case o.renewTimeout < 0:
		return 0, usage("--renew-timeout must be > 0, got %v", o.renewTimeout)
	case o.renewTimeout >= o.ttl:
		return 0, usage("--renew-timeout (%v) must be shorter than --ttl (%v)", o.renewTimeout, o.ttl)
	case o.maxFailures < 1:
		return 0, usage("--max-renew-failures must be >= 1, got %d", o.maxFailures)
	case o.maxHold < 0:
		return 0, usage("--max-hold must be >= 0, got %v", o.maxHold)
	case o.grace < 0:
		return 0, usage("--grace must be >= 0, got %v", o.grace)
	case o.name == "":
		return 0, usage("--name must not be empty")
	case o.conflictCode < 0 || o.conflictCode > 255:
		return 0, usage("--conflict-exit-code must be 0 to 255, got %d", o.conflictCode)
	}
	switch o.onStoreError {
	case "fail-closed":
		return leasehold.FailClosed, nil
	case "fail-open":
		return leasehold.FailOpen, nil
	}
	return 0, usage("--on-store-error must be fail-closed or fail-open, got %q", o.onStoreError)
}

func (a *App) run(cmd *cobra.Command, o *runOpts, args []string, res *runResult) error {
	policy, err := o.validate(cmd)
	if err != nil {
		return err
	}
	if cmd.Flags().Changed("command") { // -c '' too, as flock: not the hold mode
		args = []string{"sh", "-c", o.command}
	}
	ctx := cmd.Context()
	stderr := a.Stderr
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "leasehold run: "+format+"\n", args...)
	}

	// Signals: from now on they are ours to handle, before the lock is even
	// requested, so an interrupted wait ends cleanly.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	obs, stopMetrics, err := a.startMetrics(o.metricsAddr, "run")
	if err != nil {
		return err
	}
	defer stopMetrics()
	initSeriesOf(obs, o.name)
	report, err := o.report.start(o.name)
	if err != nil {
		return err
	}
	renewed := make(renewals, 1) // tells the supervisor the lease's new guard
	obs = teeObservers(obs, report, renewed)

	st, err := a.openStore(ctx, "run", true)
	if ue := (*unavailableError)(nil); errors.As(err, &ue) {
		// Not even opened (etcd is dialled at open): the policy decides.
		st = &storeurl.Opened{Store: downStore{err: ue.err}, Shared: true, Desc: ue.desc}
	} else if err != nil {
		return err
	}
	defer st.Close()

	locker, err := leasehold.New(st.Store, leasehold.Options{
		Name: o.name, TTL: o.ttl, RenewInterval: o.renewEvery, RenewTimeout: o.renewTimeout,
		MaxRenewFailures: o.maxFailures, MaxHold: o.maxHold, OnStoreError: policy,
		Logger: a.logger(), Observer: obs,
	})
	if err != nil {
		return usage("%v", optionError(err))
	}
	defer locker.Close()

	// Acquire, interruptible by a signal.
	actx, cancel := context.WithCancel(ctx)
	if o.wait > 0 {
		actx, cancel = context.WithTimeout(ctx, o.wait)
	}
	var (
		wg        sync.WaitGroup
		acquiring = make(chan struct{})
	)
	if o.wait > 0 && !o.quiet {
		wg.Go(func() { waitingLine(actx, stderr, st.Store, o.key, 2*time.Second, acquiring) })
	}
	started := time.Now()
	lease, interrupted, err := acquireOrSignal(actx, cancel, sigs, func(ctx context.Context) (*leasehold.Lease, error) {
		return acquireFor(ctx, locker, o)
	})
	close(acquiring)
	wg.Wait()
	cancel()
	if err == nil && interrupted != nil {
		// The grant raced the signal: the command must not start.
		if rerr := lease.Release(context.Background()); rerr != nil {
			logf("release failed (the lock expires by its TTL): %v", st.Redact(rerr))
		}
		err = context.Canceled
	}
	if err != nil {
		res.WaitedMS = ms(time.Since(started))
		err = st.Redact(err)
		switch {
		case interrupted != nil:
			return Exit(128+signum(interrupted), "interrupted by %v while acquiring %q", interrupted, o.key)
		case errors.Is(err, leasehold.ErrNotAcquired):
			res.Outcome = "not_acquired"
			return Exit(o.conflictCode, "%s", notAcquired(err, o))
		case errors.Is(err, leasehold.ErrMisconfigured):
			return misconfigured(st.Desc, fmt.Sprintf("acquire %q: ", o.key), err)
		case errors.Is(err, leasehold.ErrStore) && o.onStoreError == "fail-open":
			return Exit(ExitUnavailable, "acquire %q: store %s did not answer within --wait: %s; the command did not run (fail-open applies only to a store that fails before the wait ends)", o.key, st.Desc, storeSays(st.Desc, err))
		case errors.Is(err, leasehold.ErrStore):
			return Exit(ExitUnavailable, "acquire %q: store %s unavailable: %s; --on-store-error is fail-closed, so the command did not run", o.key, st.Desc, storeSays(st.Desc, err))
		case errors.Is(err, leasehold.ErrInvalidKey), errors.Is(err, leasehold.ErrInvalidOptions):
			return usage("%v", err)
		}
		return Exit(ExitFailure, "acquire %q: %v", o.key, err)
	}
	res.leased(lease, locker.Options().Identity, time.Since(started))
	defer func() { res.HeldMS = ms(time.Since(started)) - res.WaitedMS }()
	if len(args) == 0 {
		return a.hold(cmd.Context(), lease, st.Store, o, sigs, res)
	}
	if lease.Degraded() {
		logf("store %s unavailable: running %q WITHOUT a lock (--on-store-error fail-open, LEASEHOLD_DEGRADED=1); other replicas may run the same work", st.Desc, args[0])
	} else if a.verbose {
		logf("acquired %q fence %d", o.key, lease.Fence())
	}
	return a.supervise(lease, renewed, args, sigs, o, st.Store, logf, res)
}

// hold is run without a command: it holds the lease until a signal, then
// releases it.
func (a *App) hold(ctx context.Context, lease *leasehold.Lease, store driver.Store, o *runOpts, sigs <-chan os.Signal, res *runResult) error {
	if !a.json {
		fmt.Fprintf(a.Stdout, "holding %s: fence %d, token %s, holder %s; until SIGINT or SIGTERM\n",
			quoteUnprintable(lease.Key()), lease.Fence(), lease.Token(), quoteUnprintable(res.Holder))
	}
	select {
	case <-sigs:
	case <-lease.Done():
		cause := context.Cause(lease.Context())
		res.Cause = short(cause)
		return Exit(ExitLeaseLost, "lease on %q ended: %s", lease.Key(), endStory(ctx, store, lease.Key(), cause, o.maxFailures))
	}
	if err := lease.Release(context.Background()); errors.Is(err, leasehold.ErrNotOwned) {
		return Exit(ExitLeaseLost, "at release: %s", lostStory(ctx, store, lease.Key()))
	}
	return nil
}

// supervise runs the child under lease and returns run's exit.
func (a *App) supervise(lease *leasehold.Lease, renewed <-chan struct{}, args []string, sigs <-chan os.Signal, o *runOpts, store driver.Store, logf func(string, ...any), res *runResult) error {
	grace := o.grace
	story := func(cause error) string {
		return endStory(context.Background(), store, lease.Key(), cause, o.maxFailures)
	}
	release := func() error {
		// The lease may have ended between the child's exit and now.
		if cause := lease.Err(); cause != nil && !errors.Is(cause, leasehold.ErrLeaseReleased) {
			res.Cause = short(cause)
			return Exit(ExitLeaseLost, "lease on %q ended before it was released: %s; the command's work may have overlapped another owner's", lease.Key(), story(cause))
		}
		err := lease.Release(context.Background())
		switch {
		case errors.Is(err, leasehold.ErrNotOwned):
			return Exit(ExitLeaseLost, "at release the lock on %q was not ours: %s", lease.Key(), lostStory(context.Background(), store, lease.Key()))
		case err != nil:
			logf("release failed (the lock expires by its TTL): %v", err)
		}
		return nil
	}

	group := !a.StdinIsTerminal
	child, err := startSupervised(args, childEnv(os.Environ(), lease, o.keepStore), group, lease, renewed)
	if err != nil {
		rerr := release()
		code := ExitCannotExec
		var se *startError
		if errors.As(err, &se) {
			code = se.code
		}
		if rerr != nil {
			logf("%v", rerr)
		}
		return Exit(code, "cannot run %q: %v", args[0], err)
	}
	pid := child.pid

	var (
		ended   = lease.Done()
		cause   error
		killC   <-chan time.Time
		waitErr error
	)
loop:
	for {
		select {
		case s := <-sigs:
			child.signal(s.(syscall.Signal))
		case <-ended:
			ended = nil
			cause = context.Cause(lease.Context())
			res.Cause = short(cause)
			grace = killDelay(lease, grace)
			logf("lease on %q ended while the command ran: %s; sending SIGTERM to pid %d, SIGKILL in %v", lease.Key(), story(cause), pid, grace)
			child.signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			killC = t.C
		case <-killC:
			killC = nil
			logf("command still running %v after SIGTERM; sending SIGKILL", grace)
			child.signal(syscall.SIGKILL)
		case waitErr = <-child.done:
			break loop
		}
	}
	code := child.ended(waitErr)
	res.ChildExit = &code
	if cause == nil && guardPassed(lease) { // run was stopped: the supervisor killed the child
		if cause = lease.Err(); cause == nil {
			cause = leasehold.ErrLeaseExpired
		}
		res.Cause = short(cause)
	}
	if cause != nil {
		if group { // nothing of the job may keep working without the lease
			child.signal(syscall.SIGKILL)
		}
		return Exit(ExitLeaseLost, "lease on %q ended while the command ran; the command was stopped (its status: %d)", lease.Key(), code)
	}
	if err := release(); err != nil {
		return err
	}
	// The command's status may be any number, 2, 75 or 79 included: those
	// are run's own outcomes only when run says them.
	if res.Outcome = runOutcome(code); res.Outcome != "ok" && res.Outcome != "signal" {
		res.Outcome = "failed"
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

// killDelay is the time an ended lease's command gets between SIGTERM and
// SIGKILL: grace, but never past the lease's local expiry guard, which comes
// before the lock can expire in the store and the next holder start.
func killDelay(lease *leasehold.Lease, grace time.Duration) time.Duration {
	if until := lease.ValidUntil(); !until.IsZero() { // zero: degraded, no lock
		return max(0, min(grace, time.Until(until)))
	}
	return grace
}

func childEnv(env []string, lease *leasehold.Lease, keepStore bool) []string {
	out := make([]string, 0, len(env)+4)
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case EnvKey, EnvToken, EnvFence, EnvDegraded:
			continue
		case EnvStore:
			if !keepStore {
				continue
			}
		}
		out = append(out, kv)
	}
	out = append(out,
		EnvKey+"="+lease.Key(),
		EnvToken+"="+lease.Token(),
		EnvFence+"="+strconv.FormatUint(lease.Fence(), 10))
	if lease.Degraded() {
		out = append(out, EnvDegraded+"=1")
	}
	return out
}

// exitCode is the shell's view of a child's end: its status, or 128+N for
// signal N.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return ExitFailure
}

func signum(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 1
}

// notAcquired says who holds what run wanted, and what to do.
func notAcquired(err error, o *runOpts) string {
	switch {
	case o.limit > 0 && o.wait > 0:
		return fmt.Sprintf("not acquired within --wait %v: all %d permits of %q are held", o.wait, o.limit, o.key)
	case o.limit > 0:
		return fmt.Sprintf("not acquired: all %d permits of %q are held (use --wait to wait for one)", o.limit, o.key)
	case o.wait > 0:
		return fmt.Sprintf("not acquired within --wait %v: %q is held by another owner", o.wait, o.key)
	}
	return short(err) + " (use --wait to wait for it)"
}

// acquireFor takes the key as o says: a permit of a semaphore with --limit,
// else the lock; waiting in the queue with --wait, else one attempt.
// acquireOrSignal runs acquire under ctx, calling cancel (ctx's) when a
// signal arrives on sigs first. It returns that signal too, also when
// acquire succeeded in spite of it: a grant that raced the signal, which
// the caller gives back.
func acquireOrSignal(ctx context.Context, cancel context.CancelFunc, sigs <-chan os.Signal,
	acquire func(context.Context) (*leasehold.Lease, error)) (*leasehold.Lease, os.Signal, error) {
	var (
		interrupted os.Signal
		done        = make(chan struct{})
		watched     = make(chan struct{})
	)
	go func() {
		defer close(watched)
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-done:
		}
	}()
	lease, err := acquire(ctx)
	close(done)
	<-watched
	return lease, interrupted, err
}

func acquireFor(ctx context.Context, locker *leasehold.Locker, o *runOpts) (*leasehold.Lease, error) {
	if o.limit > 0 {
		sem, err := locker.Semaphore(o.key, o.limit)
		if err != nil {
			return nil, err
		}
		if o.wait > 0 {
			return sem.Acquire(ctx)
		}
		return sem.TryAcquire(ctx)
	}
	if o.wait > 0 {
		return locker.Acquire(ctx, o.key)
	}
	return locker.TryAcquire(ctx, o.key)
}
