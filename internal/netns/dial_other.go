//go:build !linux || !(amd64 || arm64)

package netns

import (
	"context"
	"errors"
	"net"
)

// DialContext is supported on linux/amd64 and linux/arm64 only.
func (nd *Node) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("netns: dialing into a namespace is supported on linux/amd64 and linux/arm64 only")
}
