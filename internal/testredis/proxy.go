package testredis

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target address.
// Pause holds back everything the target sends (the bytes stay in the
// proxy until Resume), as a frozen server or network would, and Cut closes
// every connection and refuses new ones: together they make a replica miss
// writes its master made before a failover, which pausing the replica
// process cannot do (the kernel would still buffer the replication stream
// for it).
type Proxy struct {
	Addr string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	resume chan struct{} // closed while not paused
	cut    bool
	conns  map[net.Conn]struct{}
}

// StartProxy listens on a free loopback port and forwards to target until
// the test ends.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, resume: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", p.target)
		if err != nil || !p.track(c, t) {
			_ = c.Close()
			if t != nil {
				_ = t.Close()
			}
			continue
		}
		p.wg.Add(2)
		go p.pipe(t, c, false)
		go p.pipe(c, t, true)
	}
}

// track registers a client and target connection pair, or refuses it after
// Cut.
func (p *Proxy) track(c, t net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c], p.conns[t] = struct{}{}, struct{}{}
	return true
}

// pipe copies from src to dst; the target-to-client direction (pausable)
// waits while the proxy is paused before writing what it read.
func (p *Proxy) pipe(dst, src net.Conn, pausable bool) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && pausable {
			p.mu.Lock()
			resume := p.resume
			p.mu.Unlock()
			<-resume
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: closing both ends tells the other side
		}
	}
}

// Pause holds back every byte the target sends from now on, until Resume
// delivers it, or Cut or Close drops it.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.resume:
		p.resume = make(chan struct{})
	default:
	}
}

// Resume delivers what Pause held back and forwards again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.resume:
	default:
		close(p.resume)
	}
}

// Cut closes every connection, dropping what Pause held back, and refuses
// new connections from now on.
func (p *Proxy) Cut() { p.drop(true) }

// Reset closes every connection, dropping what Pause held back, and
// forwards new connections again: a hung connection its client or the
// network finally gave up on.
func (p *Proxy) Reset() { p.drop(false) }

func (p *Proxy) drop(refuse bool) {
	p.mu.Lock()
	p.cut = p.cut || refuse
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.Resume() // paused pipes end: their connections are closed, so the held bytes go nowhere
}

// Close cuts every connection, stops listening and waits for the copying
// goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
