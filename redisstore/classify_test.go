package redisstore_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
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
// and a server that dies after it answered.
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
