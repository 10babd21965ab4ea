package cli

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/drill"
	"github.com/spf13/cobra"
)

// drillCmd wires the game day (package drill) into the command line and maps
// its errors to exit statuses: 2 for bad flags, 1 when an invariant failed or
// the drill could not set up its store.
func (a *App) drillCmd() *cobra.Command {
	cmd := drill.NewCommand(drill.CommandOptions{
		Metrics: a.drillMetrics,
		Logger:  func(level slog.Level) *slog.Logger { return a.logs.withDefault(a.Stderr, level) },
	})
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		// Ctrl-C or SIGTERM ends the drill cleanly: worker processes are
		// continued, told to stop and reaped, the store is healed.
		ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		c.SetContext(ctx)
		err := run(c, args)
		var ee *ExitError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ee):
			return err // already has its status (e.g. a bad --metrics-addr)
		case errors.Is(err, drill.ErrInvalidConfig):
			return &ExitError{Code: ExitUsage, Err: err}
		default: // drill.ErrInvariantViolated, drill.ErrSetup, a failed write
			return &ExitError{Code: ExitFailure, Err: err}
		}
	}
	flagErr := cmd.FlagErrorFunc()
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &ExitError{Code: ExitUsage, Err: flagErr(c, err)}
	})
	return cmd
}
