package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/internal/testtls"
)

// tlsParams returns the query parameters for CA ca and, with client, the
// client certificate of f.
func tlsParams(ca string, f testtls.Files, client bool) string {
	q := "ca_file=" + ca
	if client {
		q += "&cert_file=" + f.ClientCert + "&key_file=" + f.ClientKey
	}
	return q
}

// acquireOnce opens raw and acquires one key, bounded by a few seconds.
func acquireOnce(t *testing.T, raw string) (*storeurl.Opened, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	o, err := storeurl.Open(ctx, raw)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = o.Close() })
	tok := fmt.Sprint(time.Now().UnixNano())
	_, err = o.Store.Acquire(ctx, driver.AcquireRequest{Key: "tls-" + tok, Token: tok, TTL: 5 * time.Second})
	return o, err
}

func expectCertError(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: expected the connection refused, got none", what)
		return
	}
	if !strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "tls") {
		t.Errorf("%s: expected a certificate error, got %v", what, err)
	}
	if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrUnavailable) {
		t.Errorf("%s: expected ErrMisconfigured (never an outage), got %v", what, err)
	}
}

// TestRedisClusterTLS: a Cluster over TLS checks every node's certificate
// against ca_file and the host name it dials.
func TestRedisClusterTLS(t *testing.T) {
	f, other := testtls.New(t), testtls.New(t)
	c := testredis.StartClusterTLS(t, 3, f.CA, f.ServerCert, f.ServerKey)
	a := c.Addrs()
	url := func(host, ca string) string {
		return fmt.Sprintf("rediss://%s?addr=%s&addr=%s&prefix=tls:&ca_file=%s", strings.Replace(a[0], "127.0.0.1", host, 1), a[1], a[2], ca)
	}
	for i := range 5 { // keys in different slots, on different nodes
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		o, err := storeurl.Open(ctx, url("127.0.0.1", f.CA))
		if err == nil {
			_, err = o.Store.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprint("cluster-", i), Token: "t", TTL: 5 * time.Second})
			_ = o.Close()
		}
		cancel()
		if err != nil {
			t.Fatalf("Cluster over TLS with the test CA: %v", err)
		}
	}
	_, err := acquireOnce(t, url("127.0.0.1", other.CA))
	expectCertError(t, "Cluster nodes' certificates from an untrusted CA", err)

	wrong := testredis.StartClusterTLS(t, 3, f.CA, f.OtherHostCert, f.OtherHostKey)
	a = wrong.Addrs()
	_, err = acquireOnce(t, url("127.0.0.1", f.CA))
	expectCertError(t, "Cluster nodes' certificates for another host name", err)
}

// TestRedisTLS runs redis-server with mutual TLS and a CA the test makes.
func TestRedisTLS(t *testing.T) {
	f, other := testtls.New(t), testtls.New(t)
	srv := testredis.StartTLS(t, f.ServerCert, f.ServerKey, "--tls-ca-cert-file", f.CA, "--tls-auth-clients", "yes")
	base := "rediss://" + srv.Addr + "/0?prefix=tls:&"

	if o, err := acquireOnce(t, base+tlsParams(f.CA, f, true)); err != nil {
		t.Fatalf("mutual TLS with the test CA: %v", err)
	} else if len(o.Warnings) != 0 {
		t.Errorf("expected no warnings, got %q", o.Warnings)
	}
	_, err := acquireOnce(t, base+tlsParams(f.CA, f, false))
	expectCertError(t, "no client certificate", err)
	_, err = acquireOnce(t, base+tlsParams(other.CA, f, true))
	expectCertError(t, "server certificate from an untrusted CA", err)

	o, err := acquireOnce(t, base+tlsParams(other.CA, f, true)+"&skip_verify=true")
	if err != nil {
		t.Errorf("skip_verify=true: expected the untrusted server accepted, got %v", err)
	} else if len(o.Warnings) != 1 || !strings.Contains(o.Warnings[0], "skip_verify") {
		t.Errorf("skip_verify=true: expected a warning, got %q", o.Warnings)
	}

	_, err = storeurl.Open(t.Context(), "redis://"+srv.Addr+"?"+tlsParams(f.CA, f, true))
	if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "rediss://") {
		t.Errorf("TLS parameters on redis://: expected ErrBadURL naming rediss://, got %v", err)
	}
	_, err = storeurl.Open(t.Context(), base+"cert_file="+f.ClientCert)
	if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "key_file") {
		t.Errorf("cert_file without key_file: expected ErrBadURL, got %v", err)
	}
}

// TestEtcdTLS runs an etcd member that requires client certificates.
func TestEtcdTLS(t *testing.T) {
	f, other := testtls.New(t), testtls.New(t)
	m := testetcd.StartTLS(t, f.CA, f.ServerCert, f.ServerKey)
	base := "etcds://" + m.Addr + "?prefix=tls/&"

	if _, err := acquireOnce(t, base+tlsParams(f.CA, f, true)); err != nil {
		t.Fatalf("mutual TLS with the test CA: %v", err)
	}
	if _, err := acquireOnce(t, base+tlsParams(f.CA, f, false)); err == nil {
		t.Errorf("no client certificate: expected the connection refused")
	}
	if _, err := acquireOnce(t, base+tlsParams(other.CA, f, true)); err == nil {
		t.Errorf("server certificate from an untrusted CA: expected the connection refused")
	}
	if _, err := acquireOnce(t, "etcd://"+m.Addr+"?prefix=tls/"); err == nil {
		t.Errorf("plain etcd:// to a TLS member: expected no connection")
	}
	wrong := testetcd.StartTLS(t, f.CA, f.OtherHostCert, f.OtherHostKey)
	_, err := acquireOnce(t, "etcds://"+wrong.Addr+"?prefix=tls/&"+tlsParams(f.CA, f, true))
	expectCertError(t, "member certificate for another host name", err)
	_, err = storeurl.Open(t.Context(), "etcd://"+m.Addr+"?"+tlsParams(f.CA, f, true))
	if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "etcds://") {
		t.Errorf("TLS parameters on etcd://: expected ErrBadURL naming etcds://, got %v", err)
	}
}

// TestPostgresTLS turns on TLS in a test cluster; ca_file alone means
// sslmode=verify-full.
func TestPostgresTLS(t *testing.T) {
	f, other := testtls.New(t), testtls.New(t)
	srv := testpg.Start(t)
	srv.EnableTLS(f.ServerCert, f.ServerKey)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		base := fmt.Sprintf("postgres://%s@%s:%d/postgres?table=tls_locks&", testpg.Superuser, host, srv.Port)
		if _, err := acquireOnce(t, base+tlsParams(f.CA, f, false)); err != nil {
			t.Fatalf("TLS to %s with the test CA: %v", host, err)
		}
		_, err := acquireOnce(t, base+tlsParams(other.CA, f, false))
		expectCertError(t, "server certificate from an untrusted CA", err)
	}
	_, err := storeurl.Open(t.Context(), fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=verify-full&skip_verify=true", testpg.Superuser, srv.Port))
	if !errors.Is(err, storeurl.ErrBadURL) {
		t.Errorf("skip_verify with sslmode=verify-full: expected ErrBadURL, got %v", err)
	}
	// ca_file with a mode that does not check the host name, or may not use
	// TLS at all, is refused with the fix.
	for _, mode := range []string{"disable", "allow", "prefer", "require", "verify-ca"} {
		_, err := storeurl.Open(t.Context(), fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=%s&ca_file=%s", testpg.Superuser, srv.Port, mode, f.CA))
		if !errors.Is(err, storeurl.ErrBadURL) || !strings.Contains(err.Error(), "verify-full") {
			t.Errorf("ca_file with sslmode=%s: expected ErrBadURL naming verify-full, got %v", mode, err)
		}
	}
	// Without sslmode, PostgreSQL's default (prefer) may fall back to
	// plaintext: a warning says so.
	o, err := acquireOnce(t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?table=tls_locks", testpg.Superuser, srv.Port))
	if err != nil {
		t.Fatal(err)
	} else if len(o.Warnings) != 1 || !strings.Contains(o.Warnings[0], "plaintext") {
		t.Errorf("no sslmode: expected a warning about plaintext, got %q", o.Warnings)
	}
	// A server certificate for another host name is refused.
	wrong := testpg.Start(t)
	wrong.EnableTLS(f.OtherHostCert, f.OtherHostKey)
	_, err = acquireOnce(t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?table=tls_locks&ca_file=%s", testpg.Superuser, wrong.Port, f.CA))
	expectCertError(t, "server certificate for another host name", err)
}
