package testetcd

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// LeakWait is how long VerifyTestMain waits for goroutines to end after the
// tests. The peer listeners of an embedded member wrap connections with a
// 5 s read timeout (rafthttp's ConnReadTimeout), and a peer HTTP connection
// still open when a member stops ends only when that timeout fires: its
// net/http goroutines outlive the cluster by up to 5 s.
const LeakWait = 15 * time.Second

// VerifyTestMain runs the tests, then checks with goleak that no goroutine
// is left, waiting up to LeakWait for stragglers of stopped members instead
// of ignoring any goroutine by name. Use it in TestMain of packages that
// start embedded etcd members:
//
//	func TestMain(m *testing.M) { testetcd.VerifyTestMain(m) }
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(LeakWait)
		for {
			err := goleak.Find(opts...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: goroutines left %v after the tests: %v\n", LeakWait, err)
				code = 1
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.Exit(code)
}
