package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/outage"
)

func storeErr(op, key string, err error) error {
	return fmt.Errorf("pgstore: %s %q: %w", op, key, classify(err))
}

// outageStates are the SQLSTATEs of a server that is up but cannot serve
// for now, by class or code: a lost or refused connection (class 08 but
// 08P01, a protocol violation: a replication connection, a client that
// speaks the protocol wrongly), shutting down,
// starting up or in recovery, out of connections or memory, a statement or
// lock timeout, a standby that became read-only, a serialization failure or
// deadlock that outlived its retries.
var outageStates = []string{
	"08000", "08001", "08003", "08004", "08006", "08007", "57P01", "57P02", "57P03", "57P05", "53", "57014", "55P03", "25006", "40001", "40P01",
}

// accessStates are the SQLSTATEs of refused credentials or privileges.
var accessStates = []string{"28000", "28P01", "42501"}

// classify is the one place where the store classifies PostgreSQL errors.
// It wraps err with driver.ErrBadEntry for a corrupt row (XX001),
// driver.ErrUnavailable for an outage (refused, reset or timed-out
// connections, a connection lost after it was established, outageStates),
// driver.ErrAccessDenied for refused credentials or privileges, and
// driver.ErrMisconfigured for everything else: TLS, a server that does
// not speak PostgreSQL, a missing table, function, schema or database, any
// error not known to be an outage. The caller's cancellation and a closed
// pool are returned as they are.
func classify(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "XX001": // data_corrupted, raised by the acquire function
			return fmt.Errorf("%w: %w", driver.ErrBadEntry, err)
		case hasState(pe.Code, outageStates):
			return fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
		case hasState(pe.Code, accessStates):
			return fmt.Errorf("%w: %w", driver.ErrAccessDenied, err)
		}
		return fmt.Errorf("%w: %w", driver.ErrMisconfigured, err)
	}
	switch {
	case errors.Is(err, context.Canceled), strings.Contains(err.Error(), "closed pool"), errors.Is(err, ErrClosed):
		return err
	case isOutage(err):
		return fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", driver.ErrMisconfigured, err)
}

// isOutage reports a network failure that proves an outage: a refused,
// reset or timed-out dial, or a connection refused, reset, timed out or
// closed after it was established. While connecting, only the dial counts:
// a server that takes the connection and then closes it or never answers
// (a port speaking another protocol, a TLS refusal) is not proven down.
// pgconn keeps no error type for the dial, only its message.
func isOutage(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return strings.Contains(ce.Error(), "dial error") && outage.Net(err)
	}
	return outage.Net(err) || outage.Closed(err) || strings.Contains(err.Error(), "conn closed")
}

func hasState(code string, states []string) bool {
	for _, s := range states {
		if strings.HasPrefix(code, s) {
			return true
		}
	}
	return false
}
