package redisstore_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
	"github.com/leasehold/leasehold/storetest"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key to
// dir and returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "leasehold test redis"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "redis.crt"), filepath.Join(dir, "redis.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTLS connects with a rediss:// URL to a TLS-only redis-server whose
// self-signed certificate the client trusts, and runs the conformance suite.
func TestTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	srv := testredis.StartTLS(t, certFile, keyFile)

	opt, err := redis.ParseURL("rediss://" + srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if opt.TLSConfig == nil {
		t.Fatal("rediss:// URL: expected a TLS config")
	}
	opt.TLSConfig.RootCAs = pool
	opt.TLSConfig.MinVersion = tls.VersionTLS12
	opt.ContextTimeoutEnabled = true
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}

	// The server really speaks TLS only: an untrusting or plain client fails.
	untrusting := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}, MaxRetries: -1})
	defer untrusting.Close()
	if err := untrusting.Ping(t.Context()).Err(); err == nil {
		t.Fatal("PING with a client that does not trust the certificate: expected an error")
	}
	plain := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(t.Context()).Err(); err == nil {
		t.Fatal("PING without TLS on the TLS port: expected an error")
	}

	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return newStore(t, c, redisstore.Options{}) },
	})
}
