package redisstore_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/internal/testtls"
	"github.com/leasehold/leasehold/redisstore"
)

// tlsConfig returns a client TLS configuration that trusts caFile, with the
// client certificate of f when cert is true.
func tlsConfig(t *testing.T, caFile string, f testtls.Files, cert bool, serverName string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if cert {
		kp, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c
}

// failOpenAcquire tries key on a FailOpen Locker over a Store of c and
// returns the lease (nil when it failed closed) and the error.
func failOpenAcquire(t *testing.T, c redisstore.Client) (*leasehold.Lease, error) {
	t.Helper()
	lk, err := leasehold.New(newStore(t, c, redisstore.Options{}), leasehold.Options{Name: "classify", OnStoreError: leasehold.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	l, err := lk.TryAcquire(t.Context(), "k")
	if l != nil {
		t.Cleanup(func() { _ = l.Release(t.Context()) })
	}
	return l, err
}

// Every configuration mistake found by the security review fails closed
// under FailOpen with ErrMisconfigured, against real servers: credentials,
// permissions, TLS trust, host name and client certificates, and a client
// that speaks another protocol than the port.
func TestMisconfigurationNeverFailsOpen(t *testing.T) {
	const pass = "right-pass-123"
	ca, other := testtls.New(t), testtls.New(t)
	plain := testredis.Start(t, "--requirepass", pass)
	admin := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: plain.Addr, Password: pass})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "narrow", "on", ">narrow-pass-1", "resetkeys", "~other:*",
		"resetchannels", "&other:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	tlsSrv := testredis.StartTLS(t, ca.ServerCert, ca.ServerKey)
	mtls := testredis.StartTLS(t, ca.ServerCert, ca.ServerKey, "--tls-ca-cert-file", ca.CA, "--tls-auth-clients", "yes")
	web := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(web.Close)

	for _, tc := range []struct {
		name string
		opt  redis.Options
		want error // ErrAccessDenied, or ErrMisconfigured alone
	}{
		{"wrong password", redis.Options{ContextTimeoutEnabled: true, Addr: plain.Addr, Password: "wrong-pass-456"}, leasehold.ErrAccessDenied},
		{"no password", redis.Options{ContextTimeoutEnabled: true, Addr: plain.Addr}, leasehold.ErrAccessDenied},
		{"ACL without the prefix", redis.Options{ContextTimeoutEnabled: true, Addr: plain.Addr, Username: "narrow", Password: "narrow-pass-1"}, leasehold.ErrAccessDenied},
		{"TLS with another CA", redis.Options{ContextTimeoutEnabled: true, Addr: tlsSrv.Addr, TLSConfig: tlsConfig(t, other.CA, ca, false, "127.0.0.1")}, leasehold.ErrMisconfigured},
		{"TLS host-name mismatch", redis.Options{ContextTimeoutEnabled: true, Addr: tlsSrv.Addr, TLSConfig: tlsConfig(t, ca.CA, ca, false, "redis.example.com")}, leasehold.ErrMisconfigured},
		{"TLS without the client certificate", redis.Options{ContextTimeoutEnabled: true, Addr: mtls.Addr, TLSConfig: tlsConfig(t, ca.CA, ca, false, "127.0.0.1")}, leasehold.ErrMisconfigured},
		{"TLS with a foreign client certificate", redis.Options{ContextTimeoutEnabled: true, Addr: mtls.Addr, TLSConfig: tlsConfig(t, ca.CA, other, true, "127.0.0.1")}, leasehold.ErrMisconfigured},
		{"plaintext to a TLS port", redis.Options{ContextTimeoutEnabled: true, Addr: tlsSrv.Addr}, leasehold.ErrMisconfigured}, // the error asks "is this a Redis server?"
		{"TLS to a plaintext port", redis.Options{ContextTimeoutEnabled: true, Addr: plain.Addr, TLSConfig: tlsConfig(t, ca.CA, ca, false, "127.0.0.1")}, leasehold.ErrMisconfigured},
		{"redis:// to an HTTP port", redis.Options{ContextTimeoutEnabled: true, Addr: strings.TrimPrefix(web.URL, "http://")}, leasehold.ErrMisconfigured}, // the same
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opt.DialTimeout, tc.opt.ReadTimeout, tc.opt.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
			tc.opt.DialerRetries, tc.opt.MaxRetries = 1, -1
			c := redis.NewClient(&tc.opt)
			t.Cleanup(func() { _ = c.Close() })
			l, err := failOpenAcquire(t, c)
			if l != nil {
				t.Fatalf("expected no lease, got one (degraded %v)", l.Degraded())
			}
			if !errors.Is(err, tc.want) || errors.Is(err, leasehold.ErrUnavailable) {
				t.Fatalf("expected %v (and not ErrUnavailable), got %v", tc.want, err)
			}
			if tc.want == leasehold.ErrMisconfigured && errors.Is(err, leasehold.ErrAccessDenied) {
				t.Fatalf("expected a configuration error other than access denied, got %v", err)
			}
			if strings.Contains(err.Error(), "pass-") {
				t.Fatalf("the error shows a password: %v", err)
			}
			notRedis := strings.HasPrefix(tc.name, "plaintext") || strings.HasPrefix(tc.name, "redis://")
			if notRedis && !strings.Contains(err.Error(), "is this a Redis server?") {
				t.Fatalf("expected the question whether this is a Redis server, got %v", err)
			}
		})
	}
}

// An outage of a correctly configured server fails open: a refused port,
// a server that dies after it answered, and a proxy that closes every new
// connection once its server is gone (as a server restarted with TLS does,
// but the proxy does not speak TLS).
func TestOutageFailsOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	_ = ln.Close()
	srv := testredis.Start(t)
	crashed := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, MaxRetries: -1, DialTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = crashed.Close() })
	if err := crashed.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	for _, tc := range []struct {
		name string
		c    *redis.Client
	}{
		{"refused port", redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: refused, DialTimeout: 3 * time.Second})},
		{"server killed after it answered", crashed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { _ = tc.c.Close() })
			l, err := failOpenAcquire(t, tc.c)
			if err != nil || !l.Degraded() {
				t.Fatalf("expected a degraded lease, got %v, %v", l, err)
			}
		})
	}

	t.Run("proxy that closes new connections after the server answered", func(t *testing.T) {
		px := testredis.StartProxy(t, testredis.Start(t).Addr)
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: px.Addr, MaxRetries: -1, DialTimeout: 3 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		lk, err := leasehold.New(newStore(t, c, redisstore.Options{}), leasehold.Options{Name: "classify", OnStoreError: leasehold.FailOpen})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		if l, err := lk.TryAcquire(t.Context(), "before"); err != nil || l.Degraded() {
			t.Fatalf("expected a lease through the proxy, got %v, %v", l, err)
		}
		px.Cut()
		l, err := lk.TryAcquire(t.Context(), "after")
		if err != nil || !l.Degraded() {
			t.Fatalf("expected a degraded lease, got %v, %v", l, err)
		}
		_ = l.Release(t.Context())
	})
}

// Cluster and Sentinel clients fail closed on configuration errors too.
func TestMisconfigurationNeverFailsOpenClusterSentinel(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	for _, n := range cl.Nodes {
		c := n.Client(t)
		if err := c.ConfigSet(t.Context(), "requirepass", "right-pass-123").Err(); err != nil {
			t.Fatal(err)
		}
	}
	g := testredis.StartSentinel(t, testredis.SentinelOptions{})
	master := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: g.Master.Addr})
	t.Cleanup(func() { _ = master.Close() })
	if err := master.ConfigSet(t.Context(), "requirepass", "right-pass-123").Err(); err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(web.Close)
	webAddr := strings.TrimPrefix(web.URL, "http://")
	for _, tc := range []struct {
		name string
		c    redisstore.Client
		want error
	}{
		{"Cluster wrong password", redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: cl.Addrs(), Password: "wrong-pass-456", MaxRedirects: 1}), leasehold.ErrAccessDenied},
		{"Cluster no password", redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: cl.Addrs(), MaxRedirects: 1}), leasehold.ErrAccessDenied},
		{"Cluster seed that is not Redis", redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: []string{webAddr}, MaxRedirects: 1}), leasehold.ErrMisconfigured},
		{"Sentinel master with a password the sentinels lack", redis.NewFailoverClient(&redis.FailoverOptions{ContextTimeoutEnabled: true, MasterName: "mymaster", SentinelAddrs: g.Sentinels, Password: "wrong-pass-456"}), leasehold.ErrMisconfigured},
		{"Sentinel unknown master name", redis.NewFailoverClient(&redis.FailoverOptions{ContextTimeoutEnabled: true, MasterName: "nosuchmaster", SentinelAddrs: g.Sentinels, Password: "right-pass-123"}), leasehold.ErrMisconfigured},
		{"Sentinel address that is not Redis", redis.NewFailoverClient(&redis.FailoverOptions{ContextTimeoutEnabled: true, MasterName: "mymaster", SentinelAddrs: []string{webAddr}, Password: "right-pass-123"}), leasehold.ErrMisconfigured},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { _ = tc.c.(interface{ Close() error }).Close() })
			l, err := failOpenAcquire(t, tc.c)
			if l != nil {
				t.Fatalf("expected no lease, got one (degraded %v)", l.Degraded())
			}
			if !errors.Is(err, tc.want) || errors.Is(err, leasehold.ErrUnavailable) {
				t.Fatalf("expected %v (and not ErrUnavailable), got %v", tc.want, err)
			}
			if strings.Contains(err.Error(), "pass-") {
				t.Fatalf("the error shows a password: %v", err)
			}
			notRedis := strings.HasPrefix(tc.name, "plaintext") || strings.HasPrefix(tc.name, "redis://")
			if notRedis && !strings.Contains(err.Error(), "is this a Redis server?") {
				t.Fatalf("expected the question whether this is a Redis server, got %v", err)
			}
		})
	}
}

// A server restarted with TLS, or with mutual TLS, on the port of a store
// it answered before closes each new connection before it answers HELLO:
// that is a configuration error, not an outage, however many times the
// server answered the store earlier.
func TestRestartedWithTLSNeverFailsOpen(t *testing.T) {
	ca := testtls.New(t)
	tlsArgs := []string{"--tls-cert-file", ca.ServerCert, "--tls-key-file", ca.ServerKey}
	for _, tc := range []struct {
		name  string
		first *testredis.Server
		tls   *tls.Config
		then  []string // the restarted server's TLS arguments
	}{
		{"plaintext client, server now TLS", testredis.Start(t), nil, append(tlsArgs, "--tls-auth-clients", "no")},
		{"client without a certificate, server now mutual TLS", testredis.StartTLS(t, ca.ServerCert, ca.ServerKey),
			tlsConfig(t, ca.CA, ca, false, "127.0.0.1"), append(tlsArgs, "--tls-ca-cert-file", ca.CA, "--tls-auth-clients", "yes")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: tc.first.Addr, TLSConfig: tc.tls,
				DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, DialerRetries: 1, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			lk, err := leasehold.New(newStore(t, c, redisstore.Options{}), leasehold.Options{Name: "classify", OnStoreError: leasehold.FailOpen})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lk.Close() })
			l, err := lk.TryAcquire(t.Context(), "before")
			if err != nil || l.Degraded() {
				t.Fatalf("expected a lease from the first server, got %v, %v", l, err)
			}
			tc.first.Stop()
			startTLSOn(t, tc.first.Port, tc.then...)
			for i := range 5 { // a TLS 1.3 refusal sometimes ends in a reset, sometimes in an alert
				l, err := lk.TryAcquire(t.Context(), fmt.Sprintf("after-%d", i))
				if l != nil {
					_ = l.Release(t.Context())
					t.Fatalf("attempt %d: expected no lease, got one (degraded %v)", i, l.Degraded())
				}
				if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrUnavailable) {
					t.Fatalf("attempt %d: expected ErrMisconfigured (and not ErrUnavailable), got %v", i, err)
				}
			}
		})
	}
}

// startTLSOn runs redis-server listening only for TLS on port, with args,
// until the test ends.
func startTLSOn(t *testing.T, port int, args ...string) {
	t.Helper()
	cmd := exec.Command(testredis.Binary(t), append([]string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if nc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			_ = nc.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %d not ready", port)
		}
	}
}
