//go:build linux && (amd64 || arm64)

package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"
)

// DialContext dials addr from inside the node's namespace, as a process
// running on the node would: the socket is created while the calling
// goroutine's thread has entered the namespace (setns), and it stays there
// after the thread has returned to its own. Use it as a client's dialer
// (go-redis Options.Dialer) to reach addresses that exist only inside the
// Net; the connection is cut with the node.
func (nd *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	// Nothing else may run on this thread while it is in the node's
	// namespace, and the runtime starts no thread from a locked one.
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("netns: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + nd.Name)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("netns: %w", err)
	}
	defer target.Close()
	if err := setns(target); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("netns: enter %s: %w", nd.Name, err)
	}
	var d net.Dialer
	conn, dialErr := d.DialContext(ctx, network, addr)
	if err := setns(orig); err != nil {
		// The thread is stuck in the node's namespace: leave it locked, so
		// that it ends with this goroutine and runs nothing else.
		if conn != nil {
			_ = conn.Close()
		}
		return nil, fmt.Errorf("netns: return from %s: %w", nd.Name, err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}

// Dialer returns DialContext bounded by timeout per dial: go-redis calls a
// custom dialer without a deadline on some paths (a pub/sub connection's
// redial), and a dial into a cut node would otherwise hang for minutes of
// SYN retries.
func (nd *Node) Dialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return nd.DialContext(ctx, network, addr)
	}
}

func setns(f *os.File) error {
	if _, _, errno := syscall.Syscall(sysSetns, f.Fd(), syscall.CLONE_NEWNET, 0); errno != 0 {
		return errno
	}
	return nil
}
