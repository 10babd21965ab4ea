package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/doctor"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
)

// ExitDoctorFailed is doctor's status when at least one check FAILed.
const ExitDoctorFailed = ExitFailure

func (a *App) doctorCmd() *cobra.Command {
	var o doctor.Options
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the store's settings that can lose a lock without an error",
		Long: `doctor connects to the store of --store as a service would and checks the
settings that can lose a lock without any error: Redis eviction (maxmemory
with an evicting policy), writable replicas, failover without
min-replicas-to-write, no persistence, Cluster coverage; PostgreSQL
privileges on the lock and semaphore tables, durability against standbys and
synchronous_commit, LISTEN behind a pooler; etcd without authentication or
TLS, a member far behind, the server version; and the clock offset between
this host and the store.

It prints one line per check: OK, WARN, FAIL, or SKIP when the user of the
URL lacks the right the check needs (the line names it: run doctor again as
an operator, e.g. the leasehold-ops Redis user of docs/runbook.md), with what
it saw, why it matters for a lock, and the exact fix. --json prints the same
as one JSON object. doctor changes nothing on the server.

Exit status: 0 when no check FAILed (WARN and SKIP lines included), 1 when
at least one check FAILed, 69 when the store is unavailable, 77 when it
refused the user or password, 78 for other store configuration, 2 on bad
usage (the memory store).`,
		Example: `  leasehold doctor --store redis://127.0.0.1:6379
  leasehold doctor --store 'postgres://leasehold@db:5432/app?sslmode=verify-full' --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			desc, rs, err := a.doctor(ctx, o)
			if err != nil {
				return err
			}
			if a.json {
				err = writeJSON(a.Stdout, doctorJSON{Store: desc, Failed: doctor.Failed(rs), Checks: rs})
			} else {
				err = printDoctor(a.Stdout, desc, rs)
			}
			if err != nil {
				return err
			}
			if doctor.Failed(rs) {
				return &ExitError{Code: ExitDoctorFailed}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&o.MaxClockOffset, "max-clock-offset", doctor.DefaultMaxClockOffset,
		"largest clock offset between this host and the store that passes")
	return cmd
}

type doctorJSON struct {
	Store  string          `json:"store"`
	Failed bool            `json:"failed"`
	Checks []doctor.Result `json:"checks"`
}

// doctor opens the store of --store and runs its checks.
func (a *App) doctor(ctx context.Context, o doctor.Options) (string, []doctor.Result, error) {
	raw := a.storeFlagOrEnv()
	if storeurl.IsPostgres(raw) {
		// Not through Open: it would create the store's tables.
		pool, opts, desc, err := storeurl.PostgresPool(ctx, raw, a.Getenv)
		switch {
		case errors.Is(err, storeurl.ErrUnavailable):
			return "", nil, &ExitError{Code: ExitUnavailable, Err: err}
		case errors.Is(err, leasehold.ErrMisconfigured):
			return "", nil, misconfigured(desc, "doctor: ", err)
		case err != nil:
			return "", nil, usage("--store: %v", err)
		}
		defer pool.Close()
		return desc, doctor.Postgres(ctx, pool, opts, o), nil
	}
	st, err := a.openStore(ctx, "doctor", true)
	if err != nil {
		return "", nil, err
	}
	defer st.Close()
	var rs []doctor.Result
	switch c := st.Client().(type) {
	case redis.UniversalClient:
		rs, err = doctor.Redis(ctx, c, o)
		switch {
		case errors.Is(err, doctor.ErrRefused):
			return "", nil, Exit(ExitNoPerm, "doctor: store %s refused the credentials; check the user and password: %v", st.Desc, st.Redact(err))
		case err != nil:
			return "", nil, Exit(ExitUnavailable, "doctor: store %s unavailable: %v", st.Desc, st.Redact(err))
		}
	case *clientv3.Client:
		rs = doctor.Etcd(ctx, c, o)
	default:
		return "", nil, usage("doctor has no checks for %s", st.Desc)
	}
	for i := range rs { // a server's error text may quote the URL
		rs[i].Seen = redactText(st, rs[i].Seen)
	}
	return st.Desc, rs, nil
}

func redactText(st *storeurl.Opened, s string) string {
	if err := st.Redact(errors.New(s)); err != nil {
		return err.Error()
	}
	return s
}

// printDoctor prints one line per check: status, check, what was seen,
// and for WARN, FAIL and SKIP why it matters and the fix.
func printDoctor(w io.Writer, desc string, rs []doctor.Result) error {
	fmt.Fprintf(w, "doctor: %s\n", desc)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rs {
		line := quoteUnprintable(r.Seen)
		if r.Why != "" {
			line += ". Why: " + r.Why
		}
		if r.Fix != "" {
			line += ". Fix: " + r.Fix
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Status, r.Check, strings.TrimSpace(line))
	}
	return tw.Flush()
}
