package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/outage"
)

// accessErrors are etcd's refusals of credentials or permissions.
var accessErrors = []error{
	rpctypes.ErrPermissionDenied, rpctypes.ErrAuthFailed, rpctypes.ErrInvalidAuthToken,
	rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound, rpctypes.ErrRoleNotFound, rpctypes.ErrAuthNotEnabled,
}

// outageErrors are etcd's answers of a cluster that is up but cannot serve
// for now: no leader, a leader change, a proposal that timed out.
var outageErrors = []error{
	rpctypes.ErrNoLeader, rpctypes.ErrNotCapable, rpctypes.ErrStopped, rpctypes.ErrTimeout,
	rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTimeoutWaitAppliedIndex,
	rpctypes.ErrLeaderChanged, rpctypes.ErrTooManyRequests, rpctypes.ErrUnhealthy,
}

// handshakeText are gRPC's words for a connection whose TLS or HTTP/2
// handshake failed: it reports them as Unavailable, like an outage, and
// repeats them in the error of an RPC that waited for the connection.
var handshakeText = []string{"handshake", "tls:", "x509:", "certificate", "server preface", "http2", "speaks TLS"}

// wrap makes err the error of op on key, classified by classify; a
// request that RequestTimeout ended (timedOut) is ErrUnavailable. An outage
// while the client's connection fails its handshake (handshakeFailure) is a
// configuration error.
func (s *Store) wrap(ctx context.Context, op, key string, err error) error {
	what := fmt.Sprintf("%s %q", op, key)
	if timedOut(ctx, err) || classify(err) == leasehold.ErrUnavailable {
		if herr := s.handshakeFailure(); herr != nil {
			return classified(what, herr)
		}
	}
	if timedOut(ctx, err) {
		return fmt.Errorf("etcdstore: %s: %w: no answer within %v: %w", what, ErrUnavailable, s.timeout, err)
	}
	return classified(what, err)
}

// handshakeFailure returns the error of the client's connection when it
// keeps failing its TLS handshake (a member restarted with TLS, or refusing
// the client certificate): gRPC retries such a connection, so a request
// only times out or finds no connection. A request that does not wait for
// a connection fails with the last error of one that is failing; it is sent
// only while the client has no connection up, and waits at most 100 ms for
// one being made. Only the TLS library's refusal is proof: a connection
// closed or reset in the handshake or before the server's HTTP/2 preface
// proves nothing (a proxy whose member is down does that too) unless probe
// finds the endpoint speaking TLS to a plaintext client.
func (s *Store) handshakeFailure() error {
	if s.cli == nil || s.cli.ActiveConnection() == nil {
		return nil
	}
	conn := s.cli.ActiveConnection()
	if st := conn.GetState(); st != connectivity.TransientFailure && st != connectivity.Connecting {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(s.timeout, 100*time.Millisecond))
	defer cancel()
	_, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(false))
	switch msg := fmt.Sprint(err); {
	case err == nil || !isHandshake(err):
		return nil
	case strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:"):
		return err // the TLS library's own refusal
	case s.probe != nil:
		return s.probe()
	}
	return nil
}

// timedOut reports whether err is the end of a request of operation ctx by
// RequestTimeout (ctx's cause errTimeout): a deadline error while the
// operation's caller (callerOf) lives, not a handshake's (gRPC repeats the
// connection's last error), nor an answer that came after the deadline.
func timedOut(ctx context.Context, err error) bool {
	caller, _ := ctx.Value(callerKey{}).(context.Context)
	deadline := errors.Is(err, errTimeout) || errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
	return deadline && errors.Is(context.Cause(ctx), errTimeout) && (caller == nil || caller.Err() == nil) && !isHandshake(err)
}

// classified wraps the error of what with its classification.
func classified(what string, err error) error {
	if class := classify(err); class != nil {
		return fmt.Errorf("etcdstore: %s: %w: %w%s", what, class, err, hint(err))
	}
	return fmt.Errorf("etcdstore: %s: %w", what, err)
}

// classify is the one place where the store classifies etcd errors
// (docs/etcd.md, "Failures"): nil for an error already marked
// ErrUnavailable, the caller's cancellation and a closed store; else
// leasehold.ErrAccessDenied, leasehold.ErrUnavailable (an outage) or, for
// anything not known to be one of those, leasehold.ErrMisconfigured.
func classify(err error) error {
	c := status.Code(err)
	switch {
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
		return nil
	case isAny(err, accessErrors) || c == codes.PermissionDenied || c == codes.Unauthenticated:
		return leasehold.ErrAccessDenied
	case isHandshake(err):
		return leasehold.ErrMisconfigured
	case isAny(err, outageErrors) || c == codes.Unavailable || c == codes.DeadlineExceeded || outage.Net(err):
		return leasehold.ErrUnavailable
	}
	return leasehold.ErrMisconfigured
}

func isAny(err error, targets []error) bool {
	return slices.ContainsFunc(targets, func(t error) bool { return errors.Is(err, t) })
}

// isHandshake reports an error that names a failed TLS or HTTP/2 handshake.
func isHandshake(err error) bool {
	msg := err.Error()
	return slices.ContainsFunc(handshakeText, func(t string) bool { return strings.Contains(msg, t) })
}

// hint says what to fix for a configuration error.
func hint(err error) string {
	switch {
	case errors.Is(err, rpctypes.ErrLeaseTTLTooLarge):
		return " (the TTL is larger than etcd allows: etcd allows at most 9,000,000,000 s, about 285 years)"
	case isHandshake(err):
		return " (the TLS handshake failed: check etcds:// against the member's port, the CA, the host name and the client certificate)"
	}
	return ""
}
