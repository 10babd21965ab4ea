package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/redis/go-redis/v9"
)

// LibraryName is the name of the Redis Functions library that Library
// returns and LoadFunctions loads.
const LibraryName = "leasehold"

// functionSuffix ends every function name: the first 8 hex digits of the
// SHA-1 of the scripts, so a store never calls a library of another version
// (FCALL then fails with "Function not found").
var functionSuffix = func() string {
	h := sha1.New()
	for _, s := range []string{libSrc, acquireSrc, renewSrc, releaseSrc, inspectSrc, forceReleaseSrc, refreshSrc, semLibSrc, semAcquireSrc, semRenewSrc, semReleaseSrc, semPermitsSrc} {
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}()

// storeScripts lists every script with its function name (without the
// suffix) and whether it only reads.
var storeScripts = []struct {
	script   **redis.Script
	name     string
	src      *string
	readOnly bool
}{
	{&acquireScript, "acquire", &acquireSrc, false},
	{&renewScript, "renew", &renewSrc, false},
	{&releaseScript, "release", &releaseSrc, false},
	{&forceReleaseScript, "forcerelease", &forceReleaseSrc, false},
	{&refreshScript, "refresh", &refreshSrc, false},
	{&inspectScript, "inspect", &inspectSrc, true},
	{&semAcquireScript, "sem_acquire", &semAcquireFull, false},
	{&semRenewScript, "sem_renew", &semRenewFull, false},
	{&semReleaseScript, "sem_release", &semReleaseFull, false},
	{&semPermitsScript, "sem_permits", &semPermitsFull, true},
}

// The semaphore scripts as sent (semaphore.go prepends their helpers).
var (
	semAcquireFull = semLibSrc + semAcquireSrc
	semRenewFull   = semLibSrc + semRenewSrc
	semReleaseFull = semLibSrc + semReleaseSrc
	semPermitsFull = semLibSrc + semPermitsSrc
)

// functionName returns the FCALL name of sc.
func functionName(sc *redis.Script) string {
	for _, s := range storeScripts {
		if *s.script == sc {
			return LibraryName + "_" + s.name + "_" + functionSuffix
		}
	}
	panic("redisstore: script without a function name")
}

// Library returns the source of the Redis Functions library that holds the
// store's scripts, for FUNCTION LOAD REPLACE. Each script becomes one
// function whose name ends with a digest of the scripts, so a store only
// calls the library of its own version.
func Library() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n", LibraryName)
	for _, s := range storeScripts {
		flags := ""
		if s.readOnly {
			flags = ", flags = {'no-writes'}"
		}
		fmt.Fprintf(&b, "redis.register_function{function_name = '%s_%s_%s'%s, callback = function(KEYS, ARGV)\n%s\nend}\n",
			LibraryName, s.name, functionSuffix, flags, strings.Replace(*s.src, "-- @lib\n", libSrc, 1))
	}
	return b.String()
}

// FunctionLoader is what LoadFunctions needs: a *redis.Client, or one node
// of a Cluster (load the library on every primary).
type FunctionLoader interface {
	FunctionLoadReplace(ctx context.Context, code string) *redis.StringCmd
}

// LoadFunctions loads Library into Redis with FUNCTION LOAD REPLACE. An
// operator runs it once per server (and after every upgrade of leasehold),
// with a user allowed FUNCTION; the service user then needs +fcall and
// no +eval (Options.Functions). Errors are classified as the Store's are:
// driver.ErrAccessDenied (NOPERM: the user may not run FUNCTION;
// WRONGPASS, NOAUTH), driver.ErrUnavailable (an outage), or
// driver.ErrMisconfigured (anything else).
func LoadFunctions(ctx context.Context, c FunctionLoader) error {
	err := c.FunctionLoadReplace(ctx, Library()).Err()
	if err == nil {
		return nil
	}
	if class := classify(err); class != nil {
		return fmt.Errorf("redisstore: FUNCTION LOAD: %w: %w%s", class, err, hint(err))
	}
	return fmt.Errorf("redisstore: FUNCTION LOAD: %w", err)
}

// fcaller is what Functions mode needs of the client.
type fcaller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

// run runs sc: EVALSHA (EVAL on NOSCRIPT) by default, FCALL of its function
// with Options.Functions.
func (s *Store) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.fcall != nil {
		return functionMissing(s.fcall.FCall(ctx, functionName(sc), keys, args...))
	}
	cmd := sc.EvalSha(ctx, s.c, keys, args...)
	if !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return cmd
	}
	rctx, cancel := reloadContext(ctx)
	defer cancel()
	return sc.Eval(rctx, s.c, keys, args...)
}

// scriptReloadTimeout bounds the EVAL that follows a NOSCRIPT once the
// call's own context has ended.
const scriptReloadTimeout = 2 * time.Second

// reloadContext returns the context of the EVAL that follows a NOSCRIPT
// answer (Redis lost its script cache: a restart, a failover, SCRIPT FLUSH):
// ctx while it lasts, else ctx's values bounded by scriptReloadTimeout. The
// EVAL loads the script for every later call; were it skipped whenever the
// EVALSHA used up ctx (a deadline shorter than two round trips, such as a
// short TTL's RenewTimeout over a slow link), no call would ever load it
// and every renewal would fail until the lease is abandoned.
func reloadContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), scriptReloadTimeout)
}

// runPiped queues sc on pipe: EVAL or EVALSHA (eval chooses), or FCALL.
func (s *Store) runPiped(ctx context.Context, pipe redis.Pipeliner, eval bool, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	switch {
	case s.fcall != nil:
		return pipe.FCall(ctx, functionName(sc), keys, args...)
	case eval:
		return sc.Eval(ctx, pipe, keys, args...)
	}
	return sc.EvalSha(ctx, pipe, keys, args...)
}

// functionMissing turns "Function not found" into a configuration error
// that says what to do.
func functionMissing(cmd *redis.Cmd) *redis.Cmd {
	if err := cmd.Err(); err != nil && strings.Contains(err.Error(), "Function not found") {
		cmd.SetErr(fmt.Errorf("%w: redisstore: the Functions library of this leasehold version (%s) is not loaded: run `leasehold setup redis` (FUNCTION LOAD REPLACE) as an operator: %w",
			driver.ErrMisconfigured, functionSuffix, err))
	}
	return cmd
}
