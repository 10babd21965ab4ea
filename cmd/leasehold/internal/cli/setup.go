package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
)

// setupCmd groups the one-time operator tasks of a store.
func (a *App) setupCmd() *cobra.Command {
	setup := &cobra.Command{
		Use:   "setup",
		Short: "One-time operator tasks for a store (setup redis)",
		Args:  cobra.NoArgs,
	}
	setup.AddCommand(a.setupRedisCmd())
	return setup
}

func (a *App) setupRedisCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "redis",
		Short: "Load leasehold's Redis Functions library (FUNCTION LOAD REPLACE)",
		Long: `setup redis loads the Redis Functions library that holds leasehold's
scripts into the server of --store (every primary of a Cluster), replacing an
older version. Run it as an operator whose ACL allows FUNCTION, once per
server and again after every upgrade of leasehold. Services then use
functions=true in their store URL and need +fcall and no +eval (see the
redisstore README for both ACLs).

Exit status: 0 when loaded, 69 when Redis is unavailable, 77 when Redis
refuses (a user not allowed FUNCTION, a wrong password), 78 for other
configuration errors (TLS, protocol), 2 on bad usage.`,
		Example: `  leasehold setup redis --store 'redis://admin@127.0.0.1:6379?password_file=/run/secrets/redis-admin'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw := a.storeFlagOrEnv()
			if raw == "" {
				return usage("no store: pass --store redis://… or set %s", EnvStore)
			}
			desc, err := storeurl.LoadRedisFunctions(cmd.Context(), raw, a.Getenv)
			switch {
			case errors.Is(err, storeurl.ErrBadURL):
				return usage("--store: %v", err)
			case errors.Is(err, leasehold.ErrAccessDenied):
				return Exit(ExitNoPerm, "setup redis: Redis refused; the URL's user must be an operator allowed FUNCTION (ACL in the redisstore README): %v", err)
			case errors.Is(err, leasehold.ErrMisconfigured):
				return Exit(ExitConfig, "setup redis: %v", err)
			case err != nil:
				return Exit(ExitUnavailable, "setup redis: %v", err)
			}
			fmt.Fprintf(a.Stdout, "loaded the leasehold Functions library into %s\n", desc)
			return nil
		},
	}
}
