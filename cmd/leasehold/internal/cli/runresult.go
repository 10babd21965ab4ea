package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/redisstore"
)

// runResult is what `run --json` prints on stdout after the command ends:
// one object, also when the lock was not acquired or the store failed.
type runResult struct {
	Key         string  `json:"key"`
	Outcome     string  `json:"outcome"` // ok, failed, not_acquired, unavailable, lost, usage, signal
	ExitCode    int     `json:"exit_code"`
	Fence       uint64  `json:"fence,omitempty"`
	TokenPrefix string  `json:"token_prefix,omitempty"`
	Holder      string  `json:"holder,omitempty"`
	Degraded    bool    `json:"degraded,omitempty"`
	WaitedMS    float64 `json:"waited_ms"`
	HeldMS      float64 `json:"held_ms,omitempty"`
	ChildExit   *int    `json:"child_exit_code,omitempty"`
	Cause       string  `json:"cause,omitempty"` // why the lease ended early
	Error       string  `json:"error,omitempty"`
}

// leased fills in what the lease says.
func (r *runResult) leased(lease *leasehold.Lease, holder string, waited time.Duration) {
	r.Fence, r.Degraded, r.Holder = lease.Fence(), lease.Degraded(), holder
	r.TokenPrefix = lease.Token()
	if len(r.TokenPrefix) > 8 {
		r.TokenPrefix = r.TokenPrefix[:8]
	}
	r.WaitedMS = float64(waited) / float64(time.Millisecond)
}

// emit sets run's exit code, error and outcome in r and prints r as JSON
// when asked.
func (r *runResult) emit(a *App, err error) error {
	var ee *ExitError
	switch {
	case errors.As(err, &ee):
		r.ExitCode = ee.Code
		if ee.Err != nil {
			r.Error = ee.Err.Error()
		}
	case err != nil:
		r.ExitCode, r.Error = ExitUsage, err.Error()
	}
	if r.Outcome == "" {
		r.Outcome = runOutcome(r.ExitCode)
	}
	if a.json {
		_ = writeJSON(a.Stdout, r)
	}
	return err
}

// endStory tells why a lease ended, in words an operator can act on. For a
// lost lease it asks the store who holds the key now: another owner, or
// nobody (someone released or force-released it, e.g. an operator).
func endStory(ctx context.Context, store driver.Store, key string, cause error, maxFailures int) string {
	switch {
	case errors.Is(cause, leasehold.ErrLeaseAbandoned):
		return fmt.Sprintf("abandoned after %d failed renewals: the store could not be reached", maxFailures)
	case errors.Is(cause, leasehold.ErrLeaseExpired):
		return "expired locally: no renewal succeeded within the TTL, so the lock may already be another owner's"
	case errors.Is(cause, leasehold.ErrMaxHoldReached):
		return "--max-hold reached: renewal stopped by policy"
	case errors.Is(cause, leasehold.ErrLockerClosed):
		return "run is shutting down"
	case errors.Is(cause, redisstore.ErrEvicted):
		return "lost while Redis evicted keys under maxmemory: most likely the lock was evicted, and another holder could take it meanwhile (set maxmemory-policy noeviction; see 'leasehold doctor')"
	case errors.Is(cause, leasehold.ErrLeaseLost):
		return lostStory(ctx, store, key)
	}
	return short(cause)
}

// lostStory looks up who holds key after the store said it is not ours.
func lostStory(ctx context.Context, store driver.Store, key string) string {
	insp, ok := store.(driver.Inspector)
	if !ok {
		return "lost: the store says the lock is no longer ours"
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	li, err := insp.Inspect(ictx, key)
	switch {
	case errors.Is(err, leasehold.ErrNotHeld):
		return "released in the store by someone else (an operator's 'leasehold release' or a forced release): nobody holds it now"
	case err != nil:
		return "lost: the store says the lock is no longer ours"
	}
	return fmt.Sprintf("lost to another owner: %s holds it now (fence %d)", quoteUnprintable(li.Holder), li.Fence)
}

// waitingLine reports, every interval until stop is closed, who holds key
// and how many wait ahead: "waiting for KEY: held by HOLDER, N ahead of you,
// expires in D".
func waitingLine(ctx context.Context, w io.Writer, store driver.Store, key string, every time.Duration, stop <-chan struct{}) {
	insp, ok := store.(driver.Inspector)
	if !ok {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ictx, cancel := context.WithTimeout(ctx, every)
		li, err := insp.Inspect(ictx, key)
		cancel()
		switch {
		case errors.Is(err, leasehold.ErrNotHeld):
			fmt.Fprintf(w, "leasehold run: waiting for %s: free, taking it\n", quoteUnprintable(key))
		case err != nil:
			fmt.Fprintf(w, "leasehold run: waiting for %s: the store did not answer\n", quoteUnprintable(key))
		default:
			fmt.Fprintf(w, "leasehold run: waiting for %s: held by %s, %d waiting, expires in %v\n",
				quoteUnprintable(key), quoteUnprintable(li.Holder), li.Waiting, human(li.Remaining))
		}
	}
}

// optionError rewords the library's option errors in the flags' names, so a
// user who set --ttl 1ms reads about --ttl, not about DriftMargin.
func optionError(err error) error {
	msg := err.Error()
	for _, r := range [][2]string{
		{"MinRenewInterval", "the minimum"}, {"DriftMargin", "the drift margin (TTL/20 + 5ms unless set)"}, {"RenewInterval", "--renew-every"},
		{"RenewTimeout", "--renew-timeout"}, {"MaxRenewFailures", "--max-renew-failures"},
		{"MaxHold", "--max-hold"}, {"TTL", "--ttl"},
	} {
		msg = strings.ReplaceAll(msg, r[0], r[1])
	}
	return errors.New(strings.TrimPrefix(msg, "leasehold: invalid options: "))
}
