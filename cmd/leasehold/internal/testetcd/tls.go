package testetcd

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TLSMember is a single etcd member that serves clients over TLS only and
// requires a client certificate signed by its CA.
type TLSMember struct {
	// Addr is the client host:port (https).
	Addr string
}

// StartTLS runs the etcd binary from PATH as one member whose client port
// speaks TLS with certFile and keyFile and accepts only clients whose
// certificate caFile signed (--client-cert-auth). It is stopped in
// tb.Cleanup.
func StartTLS(tb testing.TB, caFile, certFile, keyFile string) *TLSMember {
	tb.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		tb.Skipf("testetcd: no etcd binary: %v", err)
	}
	dir := tb.TempDir()
	client, peer := freeAddr(tb), "http://"+freeAddr(tb)
	var logs bytes.Buffer
	cmd := exec.Command(bin,
		"--name", "m0", "--data-dir", filepath.Join(dir, "member"),
		"--listen-client-urls", "https://"+client, "--advertise-client-urls", "https://"+client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "m0="+peer, "--initial-cluster-state", "new",
		"--cert-file", certFile, "--key-file", keyFile,
		"--trusted-ca-file", caFile, "--client-cert-auth",
		"--logger", "zap", "--log-level", "error",
	)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testetcd: start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	if err := waitHealthyTLS(client, caFile, certFile, keyFile, done); err != nil {
		_ = cmd.Process.Kill()
		<-done // the logs are complete
		tb.Fatalf("testetcd: TLS member on %s not ready: %v\n%s", client, err, logs.String())
	}
	return &TLSMember{Addr: client}
}

// waitHealthyTLS polls /health over mutual TLS for up to 20 seconds.
func waitHealthyTLS(addr, caFile, certFile, keyFile string, done <-chan struct{}) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	// The CA is checked, not the host name: a test may give the member a
	// certificate for another host on purpose.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: true, VerifyConnection: verifyChain(pool)}} //nolint:gosec // VerifyConnection checks the chain
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get("https://" + addr + "/health")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return errExited
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy after 20s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var errExited = errors.New("etcd exited")

// verifyChain checks the server's certificate chain against pool, without
// its host name.
func verifyChain(pool *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no server certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter})
		return err
	}
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testetcd: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}
