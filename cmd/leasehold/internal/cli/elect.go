package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
)

// leaderCmd prints who leads an election (the holder of its key).
func (a *App) leaderCmd() *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "leader KEY",
		Short: "Print who leads the election on KEY (its holder and fence); --watch streams changes",
		Long: `leader prints the holder identity, fence and remaining TTL of the lease on KEY:
the leader of 'leasehold elect' (or of any Election) on that key. Exit status 1
when nobody leads, 69 when the store is unavailable, 77 when it refuses the
credentials or permissions, 78 for other store configuration errors. With --watch it prints one line (one JSON object with --json)
for every change, vacancies included, until interrupted.`,
		Args: exactArgs(1, "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.leader(cmd, args[0], watch)
		},
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "print every change of leader until interrupted")
	return cmd
}

// leaderJSON is the --json form of one leader observation.
type leaderJSON struct {
	Key         string  `json:"key"`
	Leader      bool    `json:"leader"`
	Holder      string  `json:"holder,omitempty"`
	Fence       uint64  `json:"fence,omitempty"`
	RemainingMS float64 `json:"remaining_ms,omitempty"`
}

func (a *App) leader(cmd *cobra.Command, key string, watch bool) error {
	if err := leasehold.ValidateKey(key); err != nil {
		return usage("%v", err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	st, err := a.openStore(ctx, "leader", true)
	if err != nil {
		return err
	}
	defer st.Close()
	locker, err := leasehold.New(st.Store, leasehold.Options{Name: "leader", Logger: a.logger()})
	if err != nil {
		return usage("%v", err)
	}
	defer locker.Close()
	el, err := leasehold.NewElection(locker, key, leasehold.Callbacks{})
	if err != nil {
		return usage("%v", err)
	}
	if watch {
		for ld := range el.Observe(ctx) {
			a.printLeader(key, ld)
		}
		return nil
	}
	ld, err := el.Leader(ctx)
	if err != nil {
		return storeFailure(st, "leader", err)
	}
	a.printLeader(key, ld)
	if ld.Vacant() {
		return &ExitError{Code: ExitFailure}
	}
	return nil
}

func (a *App) printLeader(key string, ld leasehold.Leader) {
	if a.json {
		_ = writeJSON(a.Stdout, leaderJSON{Key: key, Leader: !ld.Vacant(), Holder: ld.Holder, Fence: ld.Fence,
			RemainingMS: float64(ld.Remaining) / float64(time.Millisecond)})
		return
	}
	if ld.Vacant() {
		fmt.Fprintf(a.Stdout, "%s: no leader\n", quoteUnprintable(key))
		return
	}
	fmt.Fprintf(a.Stdout, "%s: led by %s, fence %d, expires in %v\n", quoteUnprintable(key),
		quoteUnprintable(ld.Holder), ld.Fence, ld.Remaining.Round(time.Millisecond))
}

// electOpts are the flags of elect.
type electOpts struct {
	key   string
	ttl   time.Duration
	grace time.Duration
	name  string
}

// electCmd campaigns on a key and runs a command while it leads.
func (a *App) electCmd() *cobra.Command {
	o := &electOpts{}
	cmd := &cobra.Command{
		Use:   "elect --key KEY [flags] -- COMMAND [ARG...]",
		Short: "Campaign for KEY and run COMMAND while this process leads; campaign again when leadership ends",
		Long: `elect takes part in a leader election on KEY. While it leads it runs COMMAND with
LEASEHOLD_KEY, LEASEHOLD_TOKEN and LEASEHOLD_FENCE set (as run does). When
leadership ends (lost, renewals abandoned, expired locally) the command gets
SIGTERM, then SIGKILL after --grace (sooner when the lock would expire in the
store first, before another candidate can lead), and elect campaigns again. When the command
exits on its own, elect resigns (the next candidate takes over at once) and exits
with the command's status. SIGINT, SIGTERM or SIGHUP stop the command the same way,
resign, and exit. Candidates take over in the order they started campaigning.
COMMAND runs in its own process group under a supervisor that kills the whole
group when elect dies for any reason, SIGKILL included, and, with SIGKILL at
once, when leadership's local guard passes while elect does not run (SIGSTOP,
a debugger, a frozen cgroup).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usage("elect needs a command after --, e.g. leasehold elect --key K -- ./reconcile")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return a.elect(cmd, o, args) },
	}
	f := cmd.Flags()
	f.StringVar(&o.key, "key", "", "election key (required)")
	f.DurationVar(&o.ttl, "ttl", 15*time.Second, "leadership TTL: a crashed leader is replaced after about this long")
	f.DurationVar(&o.grace, "grace", 10*time.Second, "time between SIGTERM and SIGKILL when leadership ends (at most until the lock would expire in the store)")
	f.StringVar(&o.name, "name", "elect", "locker name for metrics and logs")
	return cmd
}

func (a *App) elect(cmd *cobra.Command, o *electOpts, args []string) error {
	if o.key == "" {
		return usage("--key is required")
	}
	if err := leasehold.ValidateKey(o.key); err != nil {
		return usage("--key: %v", err)
	}
	if o.grace <= 0 {
		return usage("--grace must be > 0, got %v", o.grace)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	st, err := a.openStore(ctx, "elect", true)
	if err != nil {
		return err
	}
	defer st.Close()
	renewed := make(renewals, 1) // tells the supervisor the lease's new guard
	locker, err := leasehold.New(st.Store, leasehold.Options{Name: o.name, TTL: o.ttl, Logger: a.logger(), Observer: renewed})
	if err != nil {
		return usage("--ttl: %v", err)
	}
	defer locker.Close()
	runCtx, finish := context.WithCancel(ctx)
	defer finish()
	e := &elector{a: a, args: args, grace: o.grace, finish: finish, renewed: renewed}
	el, err := leasehold.NewElection(locker, o.key, leasehold.Callbacks{
		OnStartedLeading: e.lead,
		OnStoppedLeading: func(cause error) {
			if e.exited == nil && ctx.Err() == nil { // else elect ends, and says so
				fmt.Fprintf(a.Stderr, "leasehold elect: leadership of %q ended: %s; campaigning again\n", o.key, short(cause))
			}
		},
	})
	if err != nil {
		return usage("%v", err)
	}
	err = el.Run(runCtx)
	switch {
	case e.exited != nil:
		if *e.exited != 0 {
			return &ExitError{Code: *e.exited}
		}
		return nil
	case ctx.Err() != nil:
		return Exit(ExitFailure, "interrupted; resigned from %q", o.key)
	case errors.Is(err, leasehold.ErrMisconfigured):
		return misconfigured(st.Desc, fmt.Sprintf("elect %q: ", o.key), st.Redact(err))
	}
	if errors.Is(err, leasehold.ErrStore) {
		return storeFailure(st, fmt.Sprintf("elect %q", o.key), err)
	}
	return Exit(ExitFailure, "elect %q: %s", o.key, short(st.Redact(err)))
}

// elector runs the command for each term of leadership.
type elector struct {
	a       *App
	args    []string
	grace   time.Duration
	finish  context.CancelFunc
	renewed renewals
	exited  *int // the command's status once it exited on its own
}

// lead runs the command until it exits or leadership (ctx) ends.
func (e *elector) lead(ctx context.Context, lease *leasehold.Lease) {
	if e.a.verbose {
		fmt.Fprintf(e.a.Stderr, "leasehold elect: leading %q with fence %d\n", lease.Key(), lease.Fence())
	}
	child, err := startSupervised(e.args, childEnv(os.Environ(), lease, false), true, lease, e.renewed)
	if err != nil {
		code := ExitCannotExec
		var se *startError
		if errors.As(err, &se) {
			code = se.code
		}
		fmt.Fprintf(e.a.Stderr, "leasehold elect: cannot run %q: %v\n", e.args[0], err)
		e.exited = &code
		e.finish()
		return
	}
	select {
	case err := <-child.done:
		code := child.ended(err)
		if guardPassed(lease) { // killed by the supervisor: leadership ended
			return
		}
		e.exited = &code
		e.finish()
		return
	case <-ctx.Done():
	}
	grace := e.grace
	if lease.Err() != nil { // leadership ended, not elect: no renewal keeps it
		grace = killDelay(lease, grace)
	}
	child.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-child.done:
		child.ended(err)
	case <-t.C:
		child.signal(syscall.SIGKILL)
		child.ended(<-child.done)
	}
	child.signal(syscall.SIGKILL) // nothing of the job keeps working without leadership
}
