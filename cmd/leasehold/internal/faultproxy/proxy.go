// Package faultproxy is a small TCP proxy for fault drills. It listens on a
// free loopback port in front of one upstream address and forwards bytes both
// ways, and the drill can break the path on purpose: an outage (SetDown), a
// slow network (SetLatency), a partition where requests hang (Blackhole) and
// replies lost after the server applied the request (DropReplies).
//
// It knows nothing of the protocol it carries: faults act on the chunks read
// from a socket, not on requests. A connection that lost bytes is poisoned
// (it keeps losing them in that direction, so the client never sees half a
// reply) and is cut when the fault lifts, as a partition that heals resets
// the connections that crossed it.
//
// Each connection costs two goroutines (one per direction) and the proxy one
// more (the accept loop); Close cuts every connection and joins them all.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by the setters after Close.
var ErrClosed = errors.New("faultproxy: proxy closed")

// DialTimeout bounds the proxy's dial to the upstream for each connection.
const DialTimeout = time.Second

// Proxy forwards TCP connections from Addr to the upstream address, with
// faults the caller switches on and off. It is safe for concurrent use.
type Proxy struct {
	upstream string
	ln       net.Listener
	ctx      context.Context // cancelled by Close: stops dials in progress
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	down      bool
	latency   time.Duration
	blackhole bool
	dropRate  float64
	links     map[*link]struct{}

	accepted, refused, cut atomic.Int64
	forwarded, dropped     atomic.Int64
}

// Stats counts what the proxy did since Start.
type Stats struct {
	Accepted  int64 // client connections accepted and forwarded
	Refused   int64 // client connections reset at once: the proxy was down or the upstream unreachable
	Cut       int64 // connections cut by SetDown, a lifted blackhole or dropped replies, or Close
	Forwarded int64 // bytes forwarded, both directions
	Dropped   int64 // bytes read and thrown away by Blackhole or DropReplies
}

// direction of a pump.
type direction int

const (
	toUpstream direction = iota // requests
	toClient                    // replies
)

// link is one proxied connection.
type link struct {
	client   net.Conn
	mu       sync.Mutex
	upstream net.Conn // nil until dialed
	cut      chan struct{}
	once     sync.Once
	// poisoned[d] is set once bytes in direction d were dropped: the stream
	// is broken from then on, so it keeps dropping until the link is cut.
	poisoned [2]atomic.Bool
}

// Start listens on 127.0.0.1:0 and forwards every connection to upstream
// (host:port). The upstream need not be up yet: each connection dials it.
func Start(upstream string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return nil, fmt.Errorf("faultproxy: upstream %q must be host:port: %w", upstream, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{upstream: upstream, ln: ln, ctx: ctx, cancel: cancel, links: make(map[*link]struct{})}
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr returns the address clients connect to (127.0.0.1:PORT).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream returns the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted: p.accepted.Load(), Refused: p.refused.Load(), Cut: p.cut.Load(),
		Forwarded: p.forwarded.Load(), Dropped: p.dropped.Load(),
	}
}

// SetDown simulates an outage: while down, new connections are reset as soon
// as they are accepted and every open connection is cut at once.
func (p *Proxy) SetDown(down bool) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.down = down
	var victims []*link
	if down {
		victims = p.linksLocked()
	}
	p.mu.Unlock()
	for _, l := range victims {
		p.close(l)
	}
	return nil
}

// SetLatency holds every chunk read, in both directions, for d before it is
// forwarded: a round trip takes at least 2 × d. Chunks of one connection stay
// in order, so chunks pipelined behind a held one wait for it. 0 turns it off.
func (p *Proxy) SetLatency(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("faultproxy: latency must be >= 0, got %v", d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.latency = d
	return nil
}

// Blackhole simulates a partition where requests hang: connections are still
// accepted and bytes are read in both directions, but nothing is forwarded,
// so requests never reach the upstream and clients wait for their timeouts.
// Turning it off cuts every connection that lost bytes.
func (p *Proxy) Blackhole(on bool) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.blackhole = on
	p.mu.Unlock()
	if !on {
		p.cutPoisoned()
	}
	return nil
}

// DropReplies simulates replies lost after the upstream applied the request:
// requests are forwarded, and each chunk coming back is thrown away with
// probability rate (0 off, 1 every reply). A connection that lost a reply
// loses every later one too (the client times out and discards it), and is
// cut when rate goes back to 0.
func (p *Proxy) DropReplies(rate float64) error {
	if rate < 0 || rate > 1 {
		return fmt.Errorf("faultproxy: drop rate must be between 0 and 1, got %v", rate)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.dropRate = rate
	p.mu.Unlock()
	if rate == 0 {
		p.cutPoisoned()
	}
	return nil
}

// Close stops listening, cuts every connection and waits for every goroutine
// the proxy started. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	victims := p.linksLocked()
	p.mu.Unlock()
	if already {
		p.wg.Wait()
		return nil
	}
	p.cancel()
	err := p.ln.Close()
	for _, l := range victims {
		p.close(l)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) linksLocked() []*link {
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

func (p *Proxy) cutPoisoned() {
	p.mu.Lock()
	var victims []*link
	for l := range p.links {
		if l.poisoned[toUpstream].Load() || l.poisoned[toClient].Load() {
			victims = append(victims, l)
		}
	}
	p.mu.Unlock()
	for _, l := range victims {
		p.close(l)
	}
}

func (p *Proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error (e.g. too many open files): back off
			// a little rather than spin.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		l := &link{client: c, cut: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.down {
			p.mu.Unlock()
			p.refused.Add(1)
			reset(c)
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// reset closes c with an RST rather than a FIN where the OS allows it, as a
// server that is gone does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// serve dials the upstream, starts the reply pump and pumps requests.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: DialTimeout}
	up, err := d.DialContext(p.ctx, "tcp", p.upstream)
	if err != nil {
		p.refused.Add(1)
		p.close(l)
		return
	}
	l.mu.Lock()
	select {
	case <-l.cut: // cut while dialing
		l.mu.Unlock()
		_ = up.Close()
		return
	default:
	}
	l.upstream = up
	l.mu.Unlock()
	p.accepted.Add(1)
	p.wg.Add(1) // this goroutine is still counted, so Wait has not returned
	go func() {
		defer p.wg.Done()
		p.pump(l, up, l.client, toClient)
	}()
	p.pump(l, l.client, up, toUpstream)
}

// close cuts l: both sockets closed, both pumps end.
func (p *Proxy) close(l *link) {
	l.once.Do(func() {
		l.mu.Lock()
		close(l.cut)
		up := l.upstream
		l.mu.Unlock()
		reset(l.client)
		if up != nil {
			_ = up.Close()
		}
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		p.cut.Add(1)
	})
}

// faults returns the faults that apply to a chunk going in direction dir.
func (p *Proxy) faults(dir direction) (latency time.Duration, drop bool) {
	p.mu.Lock()
	latency, hole, rate := p.latency, p.blackhole, p.dropRate
	p.mu.Unlock()
	drop = hole || (dir == toClient && rate > 0 && rand.Float64() < rate)
	return latency, drop
}

// pump copies src to dst chunk by chunk, applying the faults, until either
// side fails or the link is cut; then it cuts the link.
func (p *Proxy) pump(l *link, src, dst net.Conn, dir direction) {
	defer p.close(l)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			latency, drop := p.faults(dir)
			if latency > 0 {
				t := time.NewTimer(latency)
				select {
				case <-t.C:
				case <-l.cut:
					t.Stop()
					return
				}
			}
			if drop || l.poisoned[dir].Load() {
				l.poisoned[dir].Store(true)
				p.dropped.Add(int64(n))
			} else {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
				p.forwarded.Add(int64(n))
			}
		}
		if err != nil {
			return
		}
	}
}
