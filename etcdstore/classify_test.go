package etcdstore_test

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/internal/testtls"
)

// A TTL longer than etcd's maximum lease TTL is a configuration error with
// a message that says so, never an outage.
func TestTooLargeTTLIsMisconfigured(t *testing.T) {
	_, _, s, ctx := startStore(t, 10*time.Second)
	_, err := s.Acquire(ctx, driver.AcquireRequest{Key: uniqueKey(t, ""), Token: "t", TTL: 2_550_000 * time.Hour})
	if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrUnavailable) {
		t.Fatalf("expected ErrMisconfigured, got %v", err)
	}
	if !strings.Contains(err.Error(), "9,000,000,000 s") {
		t.Fatalf("expected the error to name etcd's maximum TTL, got %v", err)
	}
}

// Open classifies its errors as the Store does: refused credentials and a
// role without the prefix are ErrAccessDenied, a refused port an outage.
func TestOpenClassifiesErrors(t *testing.T) {
	c := testetcd.Start(t)
	enableAuth(t, c)
	ep := strings.TrimPrefix(c.Endpoints()[0], "http://")
	for _, tc := range []struct {
		name, url string
		want      error
	}{
		{"wrong password", "etcd://app:wrongpw@" + ep + "?prefix=other/", leasehold.ErrAccessDenied},
		{"no credentials", "etcd://" + ep + "?prefix=other/", leasehold.ErrAccessDenied},
		{"role without the prefix", "etcd://app:apppw@" + ep + "?prefix=mine/", leasehold.ErrAccessDenied},
		{"refused port", "etcd://127.0.0.1:1", leasehold.ErrUnavailable},
	} {
		s, err := etcdstore.OpenURL(ctxFor(t, 5*time.Second), tc.url, etcdstore.Options{})
		if err == nil {
			_ = s.Close()
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: expected %v, got %v", tc.name, tc.want, err)
		}
		if tc.want == leasehold.ErrUnavailable && errors.Is(err, leasehold.ErrMisconfigured) {
			t.Errorf("%s: expected an outage, got a configuration error: %v", tc.name, err)
		}
		if err != nil && strings.Contains(err.Error(), "wrongpw") {
			t.Errorf("%s: the error shows the password: %v", tc.name, err)
		}
	}
}

// A member restarted with TLS on the endpoint of a plaintext store it
// answered before fails every new connection's handshake: gRPC retries the
// connection, so the requests only time out, and those timeouts are
// configuration errors, not an outage for a FailOpen Locker to run
// unlocked through. (A member restarted with mutual TLS that the client
// cannot pass is not covered: its refusal sometimes reaches the client as
// a broken pipe, which proves nothing.)
func TestRestartedWithTLSNeverFailsOpen(t *testing.T) {
	f := testtls.New(t)
	ep := freeAddr(t)
	stop := startEtcdOn(t, ep, nil)
	lk := failOpenLocker(t, "etcd://"+ep)
	stop()
	startEtcdOn(t, ep, []string{"--cert-file", f.ServerCert, "--key-file", f.ServerKey})
	for i := range 3 {
		l, err := lk.TryAcquire(t.Context(), fmt.Sprintf("after-%d", i))
		if l != nil {
			_ = l.Release(t.Context())
			t.Fatalf("attempt %d: expected no lease, got one (degraded %v)", i, l.Degraded())
		}
		if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrUnavailable) {
			t.Fatalf("attempt %d: expected ErrMisconfigured (and not ErrUnavailable), got %v", i, err)
		}
	}
}

// failOpenLocker returns a FailOpen Locker over a store opened from url,
// after a first lease shows the member answers.
func failOpenLocker(t *testing.T, url string) *leasehold.Locker {
	t.Helper()
	s, err := etcdstore.OpenURL(ctxFor(t, 10*time.Second), url, etcdstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	lk, err := leasehold.New(s, leasehold.Options{Name: "classify", OnStoreError: leasehold.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	if l, err := lk.TryAcquire(t.Context(), "before"); err != nil || l.Degraded() {
		t.Fatalf("expected a lease from the member at %s, got %v, %v", url, l, err)
	}
	return lk
}

// A proxy that closes every new connection once its member is gone is an
// outage, though gRPC reports it as a connection closed before the server's
// preface, as it does a member restarted with TLS.
func TestProxyClosingConnectionsIsOutage(t *testing.T) {
	c := testetcd.Start(t)
	px := testredis.StartProxy(t, strings.TrimPrefix(c.Endpoints()[0], "http://")) // any TCP proxy
	lk := failOpenLocker(t, "etcd://"+px.Addr)
	px.Cut()
	for i := range 3 {
		l, err := lk.TryAcquire(t.Context(), fmt.Sprintf("after-%d", i))
		if err != nil || !l.Degraded() {
			t.Fatalf("attempt %d: expected a degraded lease, got %v, %v", i, l, err)
		}
		_ = l.Release(t.Context())
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startEtcdOn runs a fresh one-member etcd whose client endpoint is ep,
// over TLS when tlsArgs are given, until stop or the end of the test.
func startEtcdOn(t *testing.T, ep string, tlsArgs []string) (stop func()) {
	t.Helper()
	scheme, peer := "http://", "http://"+freeAddr(t)
	if tlsArgs != nil {
		scheme = "https://"
	}
	cmd := exec.Command(testetcd.Bin(t), append([]string{"--name", "m0", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", scheme + ep, "--advertise-client-urls", scheme + ep,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "m0=" + peer,
		"--logger", "zap", "--log-level", "error"}, tlsArgs...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	t.Cleanup(stop)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", ep); err == nil {
			_ = c.Close()
			return stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd on %s not ready", ep)
		}
	}
}
