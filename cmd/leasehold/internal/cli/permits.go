package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold/driver"
)

func (a *App) permitsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "permits KEY",
		Short: "Show the permit holders and waiters of a semaphore (run --limit)",
		Long: `permits shows the semaphore on KEY as the store sees it: its last limit,
every live permit (owner token, holder identity, fence, remaining TTL), and
the number of waiters with the identity of the one at the head.

Exit status: 0 when at least one permit is held, 1 when none is, 69 when the
store is unavailable, 77 when it refuses the credentials or permissions, 78
for other store configuration errors, 2 on bad usage.`,
		Example: `  leasehold permits tenant:7:runs --store redis://127.0.0.1:6379
  leasehold permits tenant:7:runs --json | jq '.holders | length'`,
		Args: exactArgs(1, "one KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := operatorKey(args[0])
			if err != nil {
				return err
			}
			st, err := a.openStore(cmd.Context(), "permits", true)
			if err != nil {
				return err
			}
			defer st.Close()
			sem, ok := st.Store.(driver.Semaphorer)
			if !ok {
				return Exit(ExitUsage, "this store has no semaphores")
			}
			info, err := sem.Permits(cmd.Context(), key)
			if err != nil {
				return storeFailure(st, "permits "+key, err)
			}
			if err := a.printPermits(info); err != nil {
				return err
			}
			if len(info.Holders) == 0 {
				return Exit(ExitFailure, "no permit held on %q", key)
			}
			return nil
		},
	}
}

// printPermits prints a semaphore: JSON with --json, else a table.
func (a *App) printPermits(info driver.PermitInfo) error {
	if a.json {
		if info.Holders == nil {
			info.Holders = []driver.LockInfo{}
		}
		return writeJSON(a.Stdout, info)
	}
	tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%s\nlimit\t%d\nheld\t%d\nwaiting\t%d\n",
		quoteUnprintable(info.Key), info.Limit, len(info.Holders), info.Waiting)
	if info.NextHolder != "" {
		fmt.Fprintf(tw, "next holder\t%s\n", quoteUnprintable(info.NextHolder))
	}
	fmt.Fprintln(tw, "\nFENCE\tTOKEN\tHOLDER\tREMAINING")
	for _, h := range info.Holders {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%v\n", h.Fence, quoteUnprintable(h.Token), quoteUnprintable(h.Holder), h.Remaining)
	}
	return tw.Flush()
}

// inspectPermits shows key's semaphore for inspect when no lock is held on
// key: handled is true when the store has a semaphore on key with holders
// or waiters (printed, exit 0 with holders, 1 without).
func (a *App) inspectPermits(ctx context.Context, st driver.Store, key string) (handled bool, err error) {
	sem, ok := st.(driver.Semaphorer)
	if !ok {
		return false, nil
	}
	info, err := sem.Permits(ctx, key)
	if err != nil || (len(info.Holders) == 0 && info.Waiting == 0) {
		return false, nil // the lock's answer (none held) stands
	}
	if err := a.printPermits(info); err != nil {
		return true, err
	}
	if len(info.Holders) == 0 {
		return true, Exit(ExitFailure, "no lock and no permit held on %q (%d waiting for a permit)", key, info.Waiting)
	}
	return true, nil
}
