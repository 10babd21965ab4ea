package testpg

import (
	"context"
	"os"
	"time"
)

// EnableTLS turns on TLS (ssl=on) with the server certificate certFile and
// its key keyFile, copied into the server's directory for the user the
// server runs as, and reloads the configuration. Clients may still connect
// without TLS (pg_hba allows both); a client asking for sslmode=verify-full
// checks the certificate.
func (s *Server) EnableTLS(certFile, keyFile string) {
	s.tb.Helper()
	var paths [2]string
	for i, f := range []string{certFile, keyFile} {
		b, err := os.ReadFile(f)
		if err == nil {
			paths[i], err = s.p.WriteFile([]string{"server.crt", "server.key"}[i], b)
		}
		if err != nil {
			s.tb.Fatalf("testpg: %v", err)
		}
	}
	cert, key := paths[0], paths[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, q := range []string{
		"ALTER SYSTEM SET ssl_cert_file = '" + cert + "'",
		"ALTER SYSTEM SET ssl_key_file = '" + key + "'",
		"ALTER SYSTEM SET ssl = on",
		"SELECT pg_reload_conf()",
	} {
		if _, err := s.p.Query(ctx, "postgres", q); err != nil {
			s.tb.Fatalf("testpg: %v", err)
		}
	}
	// The reload is asynchronous: wait until a new session sees ssl on.
	for {
		on, err := s.p.Query(ctx, "postgres", "SHOW ssl")
		if on == "on" {
			return
		}
		if ctx.Err() != nil {
			s.tb.Fatalf("testpg: ssl not on after the reload: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
