package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// lockJSON is the --json form of a lock: stable snake_case field names.
type lockJSON struct {
	Key         string            `json:"key"`
	Held        bool              `json:"held"`
	Token       string            `json:"token,omitempty"`
	Holder      string            `json:"holder,omitempty"`
	Fence       uint64            `json:"fence,omitempty"`
	RemainingMS int64             `json:"remaining_ms"`
	Waiting     int               `json:"waiting"`
	NextHolder  string            `json:"next_holder,omitempty"`
	Facts       map[string]string `json:"facts"`
}

func toJSON(li driver.LockInfo) lockJSON {
	facts := li.Facts
	if facts == nil {
		facts = map[string]string{}
	}
	return lockJSON{Key: li.Key, Held: true, Token: li.Token, Holder: li.Holder, Fence: li.Fence,
		RemainingMS: li.Remaining.Milliseconds(), Waiting: li.Waiting, NextHolder: li.NextHolder, Facts: facts}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// human formats a duration for tables: milliseconds below a minute.
func human(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

const lockFields = `Output fields (--json uses these names):
  key           the lock key
  held          true when a lock exists (inspect --json prints {"key":…,"held":false}
                and exits 1 when none does)
  token         the owner token of the current holder
  holder        the holder's identity (hostname/pid unless the locker set another)
  fence         the fence token of the current acquisition
  remaining_ms  milliseconds until the lock expires unless renewed
  waiting       waiters queued for the key; next_holder: the identity at the head
  facts         store-specific facts, e.g. the Redis key names for redis-cli
Keys, tokens and identities with unprintable characters are shown Go-quoted
("\x1b[2J"); pass such a key quoted the same way to inspect or release it.`

func (a *App) inspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show the holder of a lock: owner token, fence, remaining TTL, store facts",
		Long: `inspect shows the current lock on KEY as the store sees it.

` + lockFields + `

When no lock is held on KEY but a semaphore on KEY (run --limit) has
permits held or waiters, inspect shows the semaphore instead, as
"leasehold permits KEY" does: its last limit, every permit holder (owner
token, holder identity, fence, remaining TTL) and the waiters.

Exit status: 0 when a lock (or a permit) is held, 1 when none is, 69 when the
store is unavailable, 77 when it refuses the credentials or permissions, 78
for other store configuration errors, 2 on bad usage. The memory store is refused: it lives
inside one process and would always be empty.`,
		Example: `  leasehold inspect scheduler:job:42 --store redis://127.0.0.1:6379
  leasehold inspect scheduler:job:42 --json | jq .fence`,
		Args: exactArgs(1, "one KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := operatorKey(args[0])
			if err != nil {
				return err
			}
			st, err := a.openStore(cmd.Context(), "inspect", true)
			if err != nil {
				return err
			}
			defer st.Close()
			insp, err := inspector(st.Store)
			if err != nil {
				return err
			}
			li, err := insp.Inspect(cmd.Context(), key)
			if errors.Is(err, leasehold.ErrNotHeld) {
				if handled, err := a.inspectPermits(cmd.Context(), st.Store, key); handled {
					return err
				}
				if a.json {
					_ = writeJSON(a.Stdout, lockJSON{Key: key, Facts: map[string]string{}})
				}
				return Exit(ExitFailure, "no lock held on %q", key)
			}
			if err != nil {
				return storeFailure(st, "inspect "+key, err)
			}
			if a.json {
				return writeJSON(a.Stdout, toJSON(li))
			}
			tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "key\t%s\n", quoteUnprintable(li.Key))
			fmt.Fprintf(tw, "token\t%s\n", quoteUnprintable(li.Token))
			if li.Holder != "" {
				fmt.Fprintf(tw, "holder\t%s\n", quoteUnprintable(li.Holder))
			}
			fmt.Fprintf(tw, "fence\t%d\n", li.Fence)
			fmt.Fprintf(tw, "remaining\t%s\n", human(li.Remaining))
			fmt.Fprintf(tw, "waiting\t%d\n", li.Waiting)
			if li.NextHolder != "" {
				fmt.Fprintf(tw, "next holder\t%s\n", quoteUnprintable(li.NextHolder))
			}
			for _, k := range slices.Sorted(maps.Keys(li.Facts)) {
				fmt.Fprintf(tw, "%s\t%s\n", quoteUnprintable(k), quoteUnprintable(li.Facts[k]))
			}
			return tw.Flush()
		},
	}
}

func (a *App) lsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls [PREFIX]",
		Aliases: []string{"list"},
		Short:   "List the locks that exist now, with owner, fence and remaining TTL",
		Long: `ls lists the locks whose key starts with PREFIX (all locks without one),
sorted by key. With --json it prints an array (empty when there are none).

` + lockFields + `

Exit status: 0 (also when there are no locks), 69 when the store is
unavailable, 77 when it refuses the credentials or permissions, 78 for other
store configuration errors, 2 on bad usage. The memory store is refused.`,
		Example: `  leasehold ls scheduler: --store redis://127.0.0.1:6379
  leasehold ls --json`,
		Args: maxArgs(1, "one PREFIX"),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			st, err := a.openStore(cmd.Context(), "ls", true)
			if err != nil {
				return err
			}
			defer st.Close()
			insp, err := inspector(st.Store)
			if err != nil {
				return err
			}
			locks, err := insp.List(cmd.Context(), prefix)
			switch {
			case errors.Is(err, leasehold.ErrBadEntry):
				// The good entries are listed; the bad ones are named on stderr.
				fmt.Fprintf(a.Stderr, "leasehold ls: skipped entries the store cannot decode: %s\n", quoteUnprintable(short(st.Redact(err))))
			case err != nil:
				return storeFailure(st, "ls", err)
			}
			if a.json {
				out := make([]lockJSON, 0, len(locks))
				for _, li := range locks {
					out = append(out, toJSON(li))
				}
				return writeJSON(a.Stdout, out)
			}
			if len(locks) == 0 {
				fmt.Fprintf(a.Stderr, "no locks with prefix %q\n", prefix)
				return nil
			}
			tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tFENCE\tREMAINING\tHOLDER\tWAITING\tTOKEN")
			for _, li := range locks {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", quoteUnprintable(li.Key), li.Fence, human(li.Remaining),
					quoteUnprintable(li.Holder), li.Waiting, quoteUnprintable(li.Token))
			}
			return tw.Flush()
		},
	}
}

// releaseJSON is the --json output of release.
type releaseJSON struct {
	Key      string `json:"key"`
	Released bool   `json:"released"`
	Forced   bool   `json:"forced"`
	// Set by --force: what was deleted.
	Token       string `json:"token,omitempty"`
	Fence       uint64 `json:"fence,omitempty"`
	RemainingMS int64  `json:"remaining_ms,omitempty"`
}

func (a *App) releaseCmd() *cobra.Command {
	var (
		token string
		force bool
	)
	cmd := &cobra.Command{
		Use:   "release KEY (--token TOKEN | --force)",
		Short: "Release a lock: token-checked, or --force to break glass",
		Long: `release deletes the lock on KEY.

With --token it is token-checked on the store: the lock is deleted only if
TOKEN still owns it. A wrong or stale token changes nothing and exits 1 with
"lock not owned".

With --force it deletes the lock whoever holds it (the break-glass path for a
holder that is stuck but still renewing) and prints what it deleted: the owner
token, the fence and the time it had left. The old holder learns at its next
renewal that it lost the lease. Fences keep increasing, so a fenced resource
still rejects the old holder's writes.

--json output fields: key, released, forced, and with --force token, fence,
remaining_ms of the deleted lock.

Exit status: 0 released, 1 not owned (with --token) or no lock held, 69 store
unavailable, 77 credentials or permissions refused, 78 other store
configuration, 2 bad usage (also: neither or both of --token and --force, or a
store that cannot force-release). The memory store is refused.`,
		Example: `  leasehold release scheduler:job:42 --token 3f2a…
  leasehold release scheduler:job:42 --force`,
		Args: exactArgs(1, "one KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := operatorKey(args[0])
			if err != nil {
				return err
			}
			switch {
			case force && cmd.Flags().Changed("token"):
				return usage("give either --token or --force, not both")
			case !force && !cmd.Flags().Changed("token"):
				return usage("missing --token TOKEN (the owner token, see 'leasehold inspect %s') or --force", key)
			case !force && token == "":
				return usage("--token is empty")
			}
			st, err := a.openStore(cmd.Context(), "release", true)
			if err != nil {
				return err
			}
			defer st.Close()
			ctx := cmd.Context()
			if !force {
				err := st.Store.Release(ctx, key, token)
				switch {
				case errors.Is(err, leasehold.ErrNotOwned):
					return Exit(ExitFailure, "lock not owned: %q is held by another token; nothing was changed", key)
				case errors.Is(err, leasehold.ErrNotHeld):
					return Exit(ExitFailure, "no lock held on %q (released or expired already); nothing was changed", key)
				case err != nil:
					return storeFailure(st, "release "+key, err)
				}
				if a.json {
					return writeJSON(a.Stdout, releaseJSON{Key: key, Released: true})
				}
				fmt.Fprintf(a.Stdout, "released %s\n", quoteUnprintable(key))
				return nil
			}
			fr, ok := st.Store.(driver.ForceReleaser)
			if !ok {
				return usage("store %s cannot force-release; use --token", st.Desc)
			}
			li, err := fr.ForceRelease(ctx, key)
			switch {
			case errors.Is(err, leasehold.ErrNotHeld):
				return Exit(ExitFailure, "no lock held on %q; nothing was deleted", key)
			case err != nil:
				return storeFailure(st, "release --force "+key, err)
			}
			if a.json {
				return writeJSON(a.Stdout, releaseJSON{Key: key, Released: true, Forced: true,
					Token: li.Token, Fence: li.Fence, RemainingMS: li.Remaining.Milliseconds()})
			}
			fmt.Fprintf(a.Stdout, "force-released %s: deleted the lock of %s, owner token %s (fence %d, %s left)\n",
				quoteUnprintable(key), quoteUnprintable(li.Holder), quoteUnprintable(li.Token), li.Fence, human(li.Remaining))
			return nil
		},
	}
	cmd.Flags().StringVar(&token, "token", "", "owner token: release only if it still owns the lock")
	cmd.Flags().BoolVar(&force, "force", false, "delete the lock whoever holds it (break glass)")
	return cmd
}

// inspector returns s's Inspector, or an error saying the store cannot list.
func inspector(s driver.Store) (driver.Inspector, error) {
	insp, ok := s.(driver.Inspector)
	if !ok {
		return nil, Exit(ExitUsage, "this store cannot inspect or list its locks")
	}
	return insp, nil
}
