package faultproxy_test

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/faultproxy"
	"github.com/leasehold/leasehold/internal/testredis"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func startProxy(t *testing.T, upstream string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// client returns a go-redis client through the proxy with short timeouts and
// no retries, so a fault shows up as an error.
func client(t *testing.T, addr string, timeout time.Duration) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		ContextTimeoutEnabled: true,
		Addr:                  addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolSize: 2,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// rawPing sends PING on a raw connection and reads one line.
func rawPing(c net.Conn, r *bufio.Reader) (string, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestPingThroughProxy(t *testing.T) {
	srv := testredis.Start(t)
	p := startProxy(t, srv.Addr)
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") || p.Upstream() != srv.Addr {
		t.Fatalf("expected a loopback proxy in front of %s, got %s -> %s", srv.Addr, p.Addr(), p.Upstream())
	}
	c := client(t, p.Addr(), time.Second)
	for range 3 {
		if got, err := c.Ping(t.Context()).Result(); err != nil || got != "PONG" {
			t.Fatalf("expected PONG through the proxy, got %q, %v", got, err)
		}
	}
	if err := c.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := srv.Client(t).Get(t.Context(), "k").Val(); got != "v" {
		t.Fatalf("expected the SET to reach Redis, got %q", got)
	}
	st := p.Stats()
	if st.Accepted < 1 || st.Forwarded == 0 || st.Dropped != 0 {
		t.Fatalf("expected accepted connections and forwarded bytes, nothing dropped, got %+v", st)
	}
}

// SetLatency holds each chunk in each direction: a PING round trip takes at
// least twice the latency (a lower bound, which scheduling cannot break).
func TestLatency(t *testing.T) {
	srv := testredis.Start(t)
	p := startProxy(t, srv.Addr)
	c := client(t, p.Addr(), 2*time.Second)
	if err := c.Ping(t.Context()).Err(); err != nil { // connect before measuring
		t.Fatal(err)
	}
	const lat = 60 * time.Millisecond
	if err := p.SetLatency(lat); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(start)
	t.Logf("PING round trip with %v latency each way: %v", lat, rtt)
	if rtt < 2*lat {
		t.Fatalf("expected a round trip of at least %v, got %v", 2*lat, rtt)
	}
	if err := p.SetLatency(0); err != nil {
		t.Fatal(err)
	}
	if err := p.SetLatency(-time.Second); err == nil {
		t.Fatal("expected an error for a negative latency")
	}
	// Latency above the client's read timeout makes the command time out.
	fast := client(t, p.Addr(), 100*time.Millisecond)
	if err := fast.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	_ = p.SetLatency(150 * time.Millisecond)
	if err := fast.Ping(t.Context()).Err(); !isTimeout(err) {
		t.Fatalf("expected a timeout with latency above the read timeout, got %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// SetDown cuts open connections and resets new ones; coming back up lets
// new connections through.
func TestDownCutsConnections(t *testing.T) {
	srv := testredis.Start(t)
	p := startProxy(t, srv.Addr)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if got, err := rawPing(conn, r); err != nil || got != "+PONG" {
		t.Fatalf("expected +PONG, got %q, %v", got, err)
	}
	if err := p.SetDown(true); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("expected the open connection cut (EOF or reset), got %v", err)
	}
	// New connections are accepted by the kernel, then reset at once.
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c2.Close()
		if got, err := rawPing(c2, bufio.NewReader(c2)); err == nil || isTimeout(err) {
			t.Fatalf("expected a new connection refused while down, got %q, %v", got, err)
		}
	}
	if st := p.Stats(); st.Refused < 1 || st.Cut < 1 {
		t.Fatalf("expected a refused and a cut connection, got %+v", st)
	}
	if err := p.SetDown(false); err != nil {
		t.Fatal(err)
	}
	if err := client(t, p.Addr(), time.Second).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("expected PING to work after the outage, got %v", err)
	}
}

// Blackhole: the request never reaches Redis and the command times out;
// lifting it cuts the connection that lost bytes and new ones work.
func TestBlackholeTimesOut(t *testing.T) {
	srv := testredis.Start(t)
	direct := srv.Client(t)
	p := startProxy(t, srv.Addr)
	c := client(t, p.Addr(), 150*time.Millisecond)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Blackhole(true); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(t.Context(), "hole", "x", 0).Err(); !isTimeout(err) {
		t.Fatalf("expected a timeout in the blackhole, got %v", err)
	}
	if n := direct.Exists(t.Context(), "hole").Val(); n != 0 {
		t.Fatalf("expected the request not to reach Redis, but the key exists")
	}
	if p.Stats().Dropped == 0 {
		t.Fatal("expected dropped bytes")
	}
	if err := p.Blackhole(false); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("expected PING to work after the blackhole, got %v", err)
	}
}

// DropReplies(1): the request is applied, the reply never comes.
func TestDropRepliesAppliesRequests(t *testing.T) {
	srv := testredis.Start(t)
	direct := srv.Client(t)
	p := startProxy(t, srv.Addr)
	c := client(t, p.Addr(), 150*time.Millisecond)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.DropReplies(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(t.Context(), "lost", "applied", 0).Err(); !isTimeout(err) {
		t.Fatalf("expected a timeout when the reply is dropped, got %v", err)
	}
	if got := direct.Get(t.Context(), "lost").Val(); got != "applied" {
		t.Fatalf("expected the request applied by Redis, got %q", got)
	}
	if err := p.DropReplies(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("expected PING to work after the replies came back, got %v", err)
	}
	for _, bad := range []float64{-0.1, 1.5} {
		if err := p.DropReplies(bad); err == nil {
			t.Errorf("expected an error for drop rate %v", bad)
		}
	}
}

// An upstream that is not listening: the client connection is closed.
func TestUpstreamUnreachable(t *testing.T) {
	p := startProxy(t, net.JoinHostPort("127.0.0.1", "1")) // nothing listens on port 1
	c := client(t, p.Addr(), time.Second)
	if err := c.Ping(t.Context()).Err(); err == nil {
		t.Fatal("expected an error when the upstream is unreachable")
	}
	if st := p.Stats(); st.Refused < 1 {
		t.Fatalf("expected a refused connection, got %+v", st)
	}
	if _, err := faultproxy.Start("no-port"); err == nil {
		t.Fatal("expected an error for an upstream without a port")
	}
}

// Close with connections open, some held by latency and some in a
// blackhole, joins every goroutine (goleak checks in TestMain) and the
// setters then return ErrClosed.
func TestCloseJoinsEverything(t *testing.T) {
	srv := testredis.Start(t)
	p, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 6 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	_ = p.SetLatency(time.Hour)
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_, _ = c.Write([]byte("PING\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 16))
		})
	}
	time.Sleep(50 * time.Millisecond) // let the pumps reach the latency wait
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("expected Close to cut held chunks, it took %v", d)
	}
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatalf("expected a second Close to be a no-op, got %v", err)
	}
	if err := p.SetDown(true); !errors.Is(err, faultproxy.ErrClosed) {
		t.Fatalf("expected ErrClosed, got %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("expected the listener closed")
	}
}
