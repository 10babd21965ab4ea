// Package cli is the leasehold command line: run, inspect, ls, release,
// calibrate and bench. cmd/leasehold only calls Main.
//
// Exit statuses are part of the interface (see ExitOK and the rest): 0 on
// success, 2 for bad usage or input with a message saying what to fix, and
// for run the child's own status, 75 when the lock was not acquired in time,
// 69 when the store is unavailable under fail-closed, 77 when the store
// refused the credentials or permissions, 78 for other store configuration
// errors (in every command that opens a store) and 79 when the lease ended
// while the command ran.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
)

// Exit statuses.
const (
	ExitOK = 0
	// ExitFailure: the operation did not succeed (a lock not held, not owned,
	// an SLO that cannot be met).
	ExitFailure = 1
	// ExitUsage: bad usage or input; the message says what to fix.
	ExitUsage = 2
	// ExitUnavailable (EX_UNAVAILABLE): the store could not be reached
	// (fail-closed: the command did not run).
	ExitUnavailable = 69
	// ExitNoPerm (EX_NOPERM): the store refused the credentials or
	// permissions (wrong password, a role or ACL without the prefix).
	ExitNoPerm = 77
	// ExitConfig (EX_CONFIG): other store configuration is wrong (TLS, a
	// port that speaks another protocol, a missing table or schema, an
	// argument the store refuses, an error not known to be an outage).
	ExitConfig = 78
	// ExitNotAcquired (EX_TEMPFAIL): another owner held the lock for the
	// whole --wait.
	ExitNotAcquired = 75
	// ExitLeaseLost: the lease was lost, abandoned or expired while the
	// command ran; the command was stopped.
	ExitLeaseLost = 79
	// ExitCannotExec and ExitNotFound follow the shell: the command could not
	// be executed or found.
	ExitCannotExec = 126
	ExitNotFound   = 127
)

// EnvStore is the environment variable that stands in for --store.
const EnvStore = "LEASEHOLD_STORE"

// ExitError carries an exit status out of a command. Err, when not nil, is
// printed to stderr as "leasehold: <err>".
type ExitError struct {
	Code int
	Err  error
	// usage adds "Run 'leasehold CMD --help' for usage." after Err: set for
	// errors about the command line itself, never for the store's answers.
	usage bool
}

// Error implements error.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// Unwrap returns Err.
func (e *ExitError) Unwrap() error { return e.Err }

// Exit returns an *ExitError with code and a message formatted from format
// and args (%w works).
func Exit(code int, format string, args ...any) error {
	return &ExitError{Code: code, Err: fmt.Errorf(format, args...)}
}

// usage returns a bad-usage error (exit 2), followed by the usage hint.
func usage(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, args...), usage: true}
}

// App holds what every command shares: output streams, global flags and the
// environment. The zero value is not usable; Main builds one.
type App struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// StderrIsTerminal turns on live progress lines (bench).
	StderrIsTerminal bool
	// StdinIsTerminal keeps run's child in the foreground process group.
	StdinIsTerminal bool

	storeURL string
	json     bool
	verbose  bool
	logs     logOptions
}

// Main runs the command line with args (without the program name) and
// returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if IsSupervisor(args) {
		return SuperviseMain(args)
	}
	app := &App{
		Stdout: stdout, Stderr: stderr, Getenv: os.Getenv,
		StderrIsTerminal: isTerminal(os.Stderr), StdinIsTerminal: isTerminal(os.Stdin),
	}
	// go-redis logs dial failures itself; the locker reports them anyway.
	redis.SetLogger(redisLogger{app})
	return app.Execute(context.Background(), app.Root(), args)
}

// Execute runs root with args and maps its error to an exit status, printing
// the message. Extra commands (the drill) can be added to root first.
func (a *App) Execute(ctx context.Context, root *cobra.Command, args []string) (code int) {
	defer func() {
		if r := recover(); r != nil { // a bug; still no stack trace for the user
			fmt.Fprintf(a.Stderr, "leasehold: internal error: %v\n", r)
			code = ExitFailure
		}
	}()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if !errors.As(err, &ee) {
		// Errors from cobra itself: unknown command, flag or argument count.
		ee = &ExitError{Code: ExitUsage, Err: err, usage: true}
	}
	if ee.Err != nil {
		fmt.Fprintf(a.Stderr, "leasehold: %s\n", strings.TrimPrefix(redactArgs(ee.Err, args).Error(), "leasehold: "))
		if ee.usage && cmd != nil {
			fmt.Fprintf(a.Stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
	}
	return ee.Code
}

// redactArgs removes from err the password of every argument that looks
// like a store URL: cobra quotes a misplaced positional argument (`inspect
// KEY redis://u:PW@h`, `leasehold redis://u:PW@h`) in its usage errors.
func redactArgs(err error, args []string) error {
	for _, arg := range args {
		if strings.Contains(arg, "://") || strings.Contains(arg, "=") {
			_, v, _ := strings.Cut(arg, "--store=")
			if v == "" {
				v = arg
			}
			err = storeurl.RedactError(err, v)
		}
	}
	return err
}

// Root returns the leasehold command with every subcommand.
func (a *App) Root() *cobra.Command {
	root := &cobra.Command{
		Use:   "leasehold",
		Short: "Distributed leases: run under a lock, inspect, release, calibrate and benchmark",
		Long: `leasehold works with the locks of a leasehold store: it runs a command under a
lease (like flock(1), but across machines), inspects and releases locks,
computes TTLs from measured numbers and benchmarks a store.

Every command that talks to a store takes --store URL (or ` + EnvStore + `):

  memory                              the embedded, in-process store (bench only:
                                      it cannot exclude other processes)
  redis://[user:password@]host:port[/db][?prefix=P]
  rediss://…                          Redis over TLS
  redis://host:port?addr=host:port…   Redis Cluster (every addr= is one more node)
  etcd://[user:password@]host:port[,host:port][?prefix=P]   etcd
  postgres://[user:password@]host:port/db[?sslmode=…&table=T&schema=S&migrate=false]   PostgreSQL

The prefix parameter sets the key prefix (Redis default "leasehold:", etcd
"leasehold/"); other Redis query parameters are go-redis options
(dial_timeout, read_timeout, max_retries, …).
Passwords are never printed.

Flags may stand before or after positional arguments; everything after --
belongs to the child command of run.

Exit statuses:
  0   success
  1   the operation failed (no such lock, lock not owned, SLO impossible)
  2   bad usage or input; the message says what to fix
  69  store unavailable (run under fail-closed: the command did not run)
  77  the store refused the credentials or permissions (nothing ran)
  78  other store configuration: TLS, a port that speaks another protocol,
      a missing table or schema, an unclassified store error (nothing ran)
  75  run: not acquired within --wait
  79  run: the lease was lost, abandoned or expired while the command ran
  126/127  run: the command could not be executed / was not found
  other    run: the command's own status (128+N when signal N ended it)`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			cmd.Root().SetOut(a.Stdout)
			return nil
		},
	}
	root.SetOut(a.Stdout)
	root.SetErr(a.Stderr)
	root.SetHelpCommand(a.helpCmd())
	root.SuggestionsMinimumDistance = 2
	root.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			if s := suggestions(cmd, args[0]); len(s) > 0 {
				return usage("unknown command %q; did you mean %s?", args[0], strings.Join(s, " or "))
			}
			return usage("unknown command %q; 'leasehold help' lists the commands", args[0])
		}
		return nil
	}
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usage("%v", err)
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.storeURL, "store", "", "store URL (default $"+EnvStore+"); see 'leasehold help'")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of tables")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "log informational records of the locker to stderr")
	a.logs.register(pf)

	root.AddCommand(a.runCmd(), a.inspectCmd(), a.lsCmd(), a.releaseCmd(), a.calibrateCmd(), a.drillCmd(), a.benchCmd(), a.setupCmd())
	root.AddCommand(a.leaderCmd(), a.electCmd(), a.versionCmd(), a.permitsCmd(), a.doctorCmd())
	root.AddCommand(a.benchChildCmd()) // hidden: one replica of bench --contention
	return root
}

// suggestions are the commands of root whose names are close to typed
// (cobra's suggestions: a distance of 2 or a prefix); none for "".
func suggestions(root *cobra.Command, typed string) []string {
	if typed == "" {
		return nil
	}
	return root.SuggestionsFor(typed)
}

// storeFlagOrEnv returns --store, else $LEASEHOLD_STORE.
func (a *App) storeFlagOrEnv() string {
	if a.storeURL != "" {
		return a.storeURL
	}
	return strings.TrimSpace(a.Getenv(EnvStore))
}

// openStore opens the store of --store or LEASEHOLD_STORE. shared refuses
// the in-process memory store, for commands that coordinate processes.
func (a *App) openStore(ctx context.Context, cmdName string, shared bool) (*storeurl.Opened, error) {
	raw := a.storeFlagOrEnv()
	if raw == "" {
		supported := storeurl.Supported
		if shared { // the memory store cannot serve this command: do not offer it
			supported = strings.Replace(supported, "memory, ", "", 1)
		}
		return nil, usage("no store: pass --store URL or set %s (one of: %s)", EnvStore, supported)
	}
	o, err := storeurl.OpenEnv(ctx, raw, a.Getenv)
	switch {
	case errors.Is(err, storeurl.ErrUnavailable):
		return nil, &ExitError{Code: ExitUnavailable, Err: &unavailableError{cmd: cmdName, desc: storeurl.Describe(raw), err: err}}
	case errors.Is(err, leasehold.ErrMisconfigured):
		return nil, misconfigured(storeurl.Describe(raw), "", err)
	case errors.Is(err, storeurl.ErrBadURL):
		return nil, usage("--store: %v", err)
	case err != nil: // the store refused or a file the URL names is unusable
		return nil, Exit(ExitUsage, "--store: %v", err)
	}
	for _, w := range o.Warnings {
		fmt.Fprintf(a.Stderr, "leasehold: warning: %s\n", w)
	}
	if shared && !o.Shared {
		_ = o.Close()
		return nil, usage("%s needs a store shared between processes, and the memory store lives inside one process: "+
			"it would exclude nothing and see no other process's locks; use redis://, rediss://, etcd:// or postgres://", cmdName)
	}
	return o, nil
}

// unavailableError is a store that did not answer when it was opened.
type unavailableError struct {
	cmd, desc string // the command and the store's redacted URL
	err       error  // wraps storeurl.ErrUnavailable
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("%s: store %s unavailable: %s", e.cmd, e.desc, storeSays(e.desc, e.err))
}

func (e *unavailableError) Unwrap() error { return e.err }

// storeFailure maps a store error of a command to its exit status, with
// the store's own words (see storeSays).
func storeFailure(o *storeurl.Opened, what string, err error) error {
	err = o.Redact(err)
	switch {
	case errors.Is(err, leasehold.ErrInvalidKey):
		return usage("%v", err)
	case errors.Is(err, context.Canceled):
		return Exit(ExitFailure, "%s: interrupted", what)
	case errors.Is(err, leasehold.ErrMisconfigured):
		return misconfigured(o.Desc, what+": ", err)
	}
	return Exit(ExitUnavailable, "%s: store %s unavailable: %s", what, o.Desc, storeSays(o.Desc, err))
}

// ownWrapping matches what leasehold's own packages put around a store's
// words: "leasehold: ", `store failure during acquire of "k": `,
// `redisstore: acquire "k": `, "store misconfigured: ", "storeurl: store
// unavailable: ".
var ownWrapping = regexp.MustCompile(`leasehold: |storeurl: store unavailable: |store failure during \w+ of "(?:[^"\\]|\\.)*": |\b(?:redis|etcd|pg|mem)store: (?:[\w ]+ "(?:[^"\\]|\\.)*": )?|store misconfigured: `)

// storeSays is what the store at desc (its redacted URL) said in err,
// without the wrappers that repeat the operation, the key, the URL or
// "leasehold:" (the caller says those once).
func storeSays(desc string, err error) string {
	msg := ownWrapping.ReplaceAllString(err.Error(), "")
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(msg, desc+": "), desc+" "), ".")
}

// misconfigured is the exit of a store that refused us or failed in a way
// not known to be an outage: ExitNoPerm for credentials and permissions,
// ExitConfig for the rest. what prefixes the message ("" or `acquire "k": `);
// err must be redacted.
func misconfigured(desc, what string, err error) error {
	if errors.Is(err, leasehold.ErrAccessDenied) {
		return Exit(ExitNoPerm, "%sstore %s refused the credentials or permissions: %s; fix the URL's user and password or the user's grants (nothing ran)", what, desc, storeSays(desc, err))
	}
	return Exit(ExitConfig, "%sstore %s is misconfigured: %s; fix the store URL or the store's configuration (nothing ran)", what, desc, storeSays(desc, err))
}

// logger returns the slog logger for lockers: warnings and errors on stderr,
// informational records too with --verbose; --log-level and --log-format
// choose the level and text or JSON.
func (a *App) logger() *slog.Logger { return a.logs.logger(a.Stderr, a.verbose) }

// exactArgs is cobra.ExactArgs with a message that names the arguments.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usage("%s takes %s, got %d argument(s): %q", cmd.Name(), names, len(args), args)
		}
		return nil
	}
}

func maxArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > n {
			return usage("%s takes at most %s, got %d arguments: %q", cmd.Name(), names, len(args), args)
		}
		return nil
	}
}

// short is err's message without the library's "leasehold: " prefix, for
// messages that already start with it.
func short(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.ReplaceAll(err.Error(), "leasehold: ", "")
}

// redisLogger shows go-redis's own log lines only with --verbose.
type redisLogger struct{ a *App }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l.a.verbose {
		fmt.Fprintln(l.a.Stderr, "redis:", strings.TrimRight(fmt.Sprintf(format, v...), "\n"))
	}
}

// downStore stands in for a store that could not even be opened, so that a
// Locker applies its store-failure policy to it like to any outage.
type downStore struct{ err error }

func (d downStore) Acquire(context.Context, driver.AcquireRequest) (driver.Grant, error) {
	return driver.Grant{}, d.err
}
func (d downStore) Renew(context.Context, string, string, time.Duration) error { return d.err }
func (d downStore) Release(context.Context, string, string) error              { return d.err }
func (d downStore) Inspect(context.Context, string) (driver.LockInfo, error) {
	return driver.LockInfo{}, d.err
}
func (d downStore) List(context.Context, string) ([]driver.LockInfo, error) { return nil, d.err }
