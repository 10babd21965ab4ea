package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/outage"
)

// outageReplies are the Redis error prefixes of a server that is up but
// cannot serve for now: loading its data set, a replica during failover,
// a Cluster resharding or without quorum, a long script.
var outageReplies = []string{"LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY", "NOREPLICAS"}

// credentialReplies are the Redis error prefixes of refused credentials or
// permissions.
var credentialReplies = []string{"WRONGPASS", "NOAUTH", "NOPERM"}

// fail wraps an error of op on key with what classify says. The Locker
// wraps the result in a *StoreError.
func (s *Store) fail(op, key string, err error) error {
	switch {
	case redis.HasErrorPrefix(err, "BADENTRY"):
		return fmt.Errorf("redisstore: %s %q: %w: %s (delete the named Redis key to recover: its next fence comes from the server clock)",
			op, key, driver.ErrBadEntry, strings.TrimPrefix(scriptError(err), "BADENTRY "))
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return fmt.Errorf("redisstore: %s %q: %w: %w: %w (a Redis key under %s{...} holds another type: delete it or use another Prefix)",
			op, key, driver.ErrMisconfigured, driver.ErrBadEntry, err, s.prefix)
	}
	if class := classify(err); class != nil {
		return fmt.Errorf("redisstore: %s %q: %w: %w%s", op, key, class, err, hint(err))
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

// classify is the one place where the store classifies Redis errors. It
// returns driver.ErrUnavailable for an outage (see isOutage); nil for
// the caller's cancellation and a closed client; driver.ErrAccessDenied
// for refused credentials or permissions; and driver.ErrMisconfigured
// for everything else (TLS, a server that speaks another protocol, a
// database that does not exist, any error not known to be an outage).
func classify(err error) error {
	switch {
	case isOutage(err):
		return driver.ErrUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, redis.ErrClosed), errors.Is(err, ErrClosed):
		return nil
	case isCredentials(err):
		return driver.ErrAccessDenied
	}
	return driver.ErrMisconfigured
}

// isOutage reports an error positively known to be an outage of a
// reachable, correctly configured server: a refused or reset connection, a
// timeout, a connection closed after its handshake, a pool that timed out,
// or a server answer from outageReplies.
func isOutage(err error) bool {
	var hs *handshakeError
	if errors.As(err, &hs) {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		for _, p := range outageReplies {
			if redis.HasErrorPrefix(err, p) {
				return true
			}
		}
		return false
	}
	return errors.Is(err, redis.ErrPoolTimeout) || outage.Net(err) || outage.Closed(err)
}

// isCredentials reports an error about credentials or permissions.
func isCredentials(err error) bool {
	for _, p := range credentialReplies {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "unauthenticated") || strings.Contains(msg, "no permissions to")
}

// hint says what to check for a configuration error.
func hint(err error) string {
	var hs *handshakeError
	switch {
	case strings.Contains(err.Error(), "unauthenticated"):
		return " (the server requires a password)"
	case errors.As(err, &hs):
		return " (" + hs.hint + ")"
	}
	return ""
}

// handshakeError is a connection that was made but whose handshake failed:
// a TLS handshake or verification error, or a server that closed a fresh
// connection or answered in another protocol instead of answering HELLO.
// Neither is an outage.
type handshakeError struct {
	err  error
	hint string
}

func (e *handshakeError) Error() string { return e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// handshakeHook marks handshake failures as handshakeError, for classify: a
// dial error other than the TCP connection's own (*net.OpError) comes from
// the TLS handshake, and a connection closed (or a reply not in Redis's
// protocol) before the server ever answered refused the protocol (a
// plaintext client on a TLS port, another service) or the client
// certificate (TLS 1.3 reports it after the handshake). Once the server
// has answered, a closed connection is an outage.
type handshakeHook struct {
	answered atomic.Bool // the server answered a command
}

func (h *handshakeHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		var op *net.OpError
		if err != nil && !errors.As(err, &op) && !errors.Is(err, context.Canceled) {
			err = &handshakeError{err, "the TLS handshake failed or got no answer: check that the port speaks TLS (rediss://), the CA, the host name and the client certificate"}
		}
		return c, err
	}
}

func (h *handshakeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.check(next(ctx, cmd))
	}
}

func (h *handshakeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return h.check(next(ctx, cmds))
	}
}

// check notes an answer from the server, or marks a connection closed
// before any answer.
func (h *handshakeHook) check(err error) error {
	var rerr redis.Error
	switch {
	case err == nil || errors.As(err, &rerr):
		if !h.answered.Load() {
			h.answered.Store(true)
		}
	case !h.answered.Load() && notRedis(err):
		return &handshakeError{err, "is this a Redis server? it closed the connection or answered in another protocol before it ever answered: check the host and port, that the port speaks Redis without TLS (redis://) or with TLS (rediss://), and the client certificate"}
	}
	return err
}

// notRedis reports a failure of a connection's first exchange that a server
// speaking Redis does not cause: the connection closed or reset, or a reply
// go-redis could not parse.
func notRedis(err error) bool {
	if outage.Closed(err) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"redis: can't parse", "redis: invalid reply", "redis: unexpected", "unknown reply", "protocol error"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// isEntryError reports an error that concerns one entry, not the store.
func isEntryError(err error) bool {
	return redis.HasErrorPrefix(err, "BADENTRY") || redis.HasErrorPrefix(err, "WRONGTYPE")
}

// scriptError returns a script's error message without Redis's " script: …"
// suffix.
func scriptError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, " script: "); i >= 0 {
		return msg[:i]
	}
	return msg
}
