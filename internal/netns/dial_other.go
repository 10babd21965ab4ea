//go:build !linux || !(amd64 || arm64)

package netns

import (
	"context"
	"errors"
	"net"
	"time"
)

// Dialer returns DialContext, which is not supported here.
func (nd *Node) Dialer(time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return nd.DialContext
}

// DialContext is supported on linux/amd64 and linux/arm64 only.
func (nd *Node) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("netns: dialing into a namespace is supported on linux/amd64 and linux/arm64 only")
}
