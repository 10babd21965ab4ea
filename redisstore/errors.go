package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

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
// has answered, a closed connection is an outage, unless probe finds the
// server refusing new connections' handshakes: a server restarted with TLS
// or mutual TLS closes the HELLO of every new connection, as a proxy in
// front of a server that is down does.
type handshakeHook struct {
	answered atomic.Bool            // the server answered a command
	addr     atomic.Pointer[string] // the address last dialled
	probes   bool                   // a client of one server at a time, whose TLS is tls
	tls      *tls.Config
}

func (h *handshakeHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		var op *net.OpError
		if err != nil && !errors.As(err, &op) && !errors.Is(err, context.Canceled) {
			err = &handshakeError{err, "the TLS handshake failed or got no answer: check that the port speaks TLS (rediss://), the CA, the host name and the client certificate"}
		}
		if err == nil && network == "tcp" {
			h.addr.Store(&addr)
		}
		return c, err
	}
}

func (h *handshakeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := h.check(next(ctx, cmd))
		var hs *handshakeError
		if cmd.Name() == "hello" && err != nil && !errors.As(err, &hs) && notRedis(err) {
			if perr := h.probe(ctx); perr != nil {
				// go-redis fails the command that waited for the new
				// connection with its HELLO's error unwrapped once.
				err = fmt.Errorf("%w", &handshakeError{err, perr.Error()})
				cmd.SetErr(err)
			}
		}
		return err
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

// probeTimeout bounds probe.
const probeTimeout = time.Second

// probe looks for positive proof that a new connection closed in answer to
// its HELLO was refused rather than lost: the address last dialled now
// speaks TLS to a plaintext client, or refuses a TLS client's certificate
// with an alert. It returns what it proved, or nil.
func (h *handshakeHook) probe(ctx context.Context) error {
	ap := h.addr.Load()
	if !h.probes || ap == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", *ap)
	if err != nil {
		return nil
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	cfg := &tls.Config{InsecureSkipVerify: true} // only to learn whether the port speaks TLS
	if h.tls != nil {
		cfg = h.tls.Clone()
	}
	if host, _, err := net.SplitHostPort(*ap); err == nil && cfg.ServerName == "" {
		cfg.ServerName = host
	}
	tc := tls.Client(conn, cfg)
	err = tc.HandshakeContext(ctx)
	if err == nil && h.tls != nil {
		_, err = tc.Read(make([]byte, 1)) // TLS 1.3 refuses a certificate after the handshake
	}
	switch alert := err != nil && strings.Contains(err.Error(), "remote error: tls:"); {
	case h.tls == nil && (err == nil || alert):
		return fmt.Errorf("%s speaks TLS: use rediss:// with its CA", *ap)
	case h.tls != nil && alert:
		return fmt.Errorf("%s refuses the TLS client (%v): check the client certificate and the server's CA", *ap, err)
	}
	return nil
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
