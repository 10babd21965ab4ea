// Package outage recognises the network failures that prove a store is down
// rather than misconfigured. Stores build their classification on it: an
// error is an outage only when a rule here (or a store's own rule for its
// server's answers) says so, and everything else is a configuration error.
package outage

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// Net reports whether err is a failure of the network path to a store that
// says nothing about its configuration: a refused, reset or aborted
// connection, an unreachable host or network, or a timeout (a dial, read or
// request deadline, and a caller's context deadline). It reports false for a
// cancelled context, a host name that does not resolve, TLS handshake and
// verification failures, and a connection closed cleanly (see Closed).
func Net(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return !dns.IsNotFound
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	for _, e := range []error{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.ENETDOWN, syscall.ETIMEDOUT,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Closed reports whether err says the connection ended (EOF, a closed
// connection). That is an outage only on a connection that has already
// answered: a server that closes a fresh connection may be refusing the
// protocol (a plaintext client on a TLS port) and the caller must decide.
func Closed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}
