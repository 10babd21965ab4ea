// Package testtls makes a certificate authority for tests, with a server
// certificate for the loopback names (127.0.0.1, ::1, localhost) and a client
// certificate, written as PEM files for servers started by the tests
// (redis-server, etcd, PostgreSQL) and for store URLs (ca_file, cert_file,
// key_file).
package testtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// Files are the PEM files of one test CA.
type Files struct {
	// CA is the authority's certificate: the trust anchor for both sides.
	CA string
	// ServerCert and ServerKey are for 127.0.0.1, ::1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate (common name
	// "leasehold-client") for mutual TLS.
	ClientCert, ClientKey string
	// OtherHostCert and OtherHostKey are a server certificate of the same CA
	// for the name "other.example" only: a client that dials a loopback
	// address must refuse it (host-name mismatch).
	OtherHostCert, OtherHostKey string
}

var serial atomic.Int64

// New creates a CA and its server and client certificates in a fresh
// temporary directory of tb. Every call makes a different CA, so a second
// one is an untrusted authority for the first one's servers.
func New(tb testing.TB) Files {
	tb.Helper()
	dir := tb.TempDir()
	caKey := newKey(tb)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: "leasehold test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER := create(tb, caTmpl, caTmpl, caKey, caKey)
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatalf("testtls: %v", err)
	}
	f := Files{CA: filepath.Join(dir, "ca.crt")}
	writePEM(tb, f.CA, "CERTIFICATE", caDER)

	leaf := func(name string, usage []x509.ExtKeyUsage, hosts bool, dnsNames ...string) (string, string) {
		key := newKey(tb)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial.Add(1)),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
		}
		if hosts {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
			tmpl.DNSNames = []string{"localhost"}
		}
		tmpl.DNSNames = append(tmpl.DNSNames, dnsNames...)
		cert, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		writePEM(tb, cert, "CERTIFICATE", create(tb, tmpl, ca, key, caKey))
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			tb.Fatalf("testtls: %v", err)
		}
		writePEM(tb, keyFile, "PRIVATE KEY", kder)
		return cert, keyFile
	}
	// etcd's gateway dials its own member with the server certificate, so
	// the server certificate is good for client authentication too.
	f.ServerCert, f.ServerKey = leaf("server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, true)
	f.ClientCert, f.ClientKey = leaf("leasehold-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false)
	f.OtherHostCert, f.OtherHostKey = leaf("other-host", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, false, "other.example")
	return f
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testtls: %v", err)
	}
	return k
}

func create(tb testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) []byte {
	tb.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		tb.Fatalf("testtls: %v", err)
	}
	return der
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("testtls: %v", err)
	}
}
