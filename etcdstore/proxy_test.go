package etcdstore_test

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// freezer is a TCP proxy in front of an etcd member that can stop passing
// bytes without closing connections: the member looks hung to its clients
// (what SIGSTOP does to an external server).
type freezer struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	thawed chan struct{} // nil while not frozen
	down   bool          // cut: connections refused
	conns  []net.Conn
	wg     sync.WaitGroup
}

// startFreezer proxies to the member at clientURL (http://host:port) and
// stops in t.Cleanup.
func startFreezer(t *testing.T, clientURL string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, upstream: strings.TrimPrefix(clientURL, "http://")}
	f.wg.Go(f.accept)
	t.Cleanup(f.close)
	return f
}

// Endpoint is the proxy's address for clientv3.Config.Endpoints.
func (f *freezer) Endpoint() string { return f.ln.Addr().String() }

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		down := f.down
		f.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		u, err := net.Dial("tcp", f.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, u)
		f.mu.Unlock()
		f.wg.Go(func() { f.pipe(u, c) })
		f.wg.Go(func() { f.pipe(c, u) })
	}
}

func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate blocks while the proxy is frozen.
func (f *freezer) gate() {
	f.mu.Lock()
	ch := f.thawed
	f.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// freeze holds every byte until the returned thaw is called.
func (f *freezer) freeze() (thaw func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.thawed = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.thawed = nil
			f.mu.Unlock()
			close(ch)
		})
	}
}

// cut closes every connection and refuses new ones until the returned
// restore is called: a request sent meanwhile never reaches the member.
func (f *freezer) cut() (restore func()) {
	f.mu.Lock()
	f.down = true
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		f.down = false
		f.mu.Unlock()
	}
}

func (f *freezer) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	if f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
