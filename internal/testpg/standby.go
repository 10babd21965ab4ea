package testpg

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// StartStandby copies the running server s with pg_basebackup (-R writes
// the standby configuration: primary_conninfo and standby.signal) and starts
// the copy as a streaming standby on its own free loopback port. t.Cleanup
// stops it and removes its files. The standby answers read-only queries
// until Promote.
func (s *Server) StartStandby() *Server {
	s.tb.Helper()
	st := &Server{bin: s.bin, tb: s.tb, cred: s.cred}
	st.Dir = st.mkdir()
	s.tb.Cleanup(st.Stop)
	st.run("pg_basebackup", "-D", st.dataDir(), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port),
		"-U", Superuser, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		st.Port = freePort(s.tb)
		if lastErr = st.start(); lastErr == nil {
			st.up = true
			return st
		}
	}
	s.tb.Fatalf("testpg: start the standby: %v", lastErr)
	return nil
}

// Promote turns a standby into a primary (pg_ctl promote, waiting until it
// accepts writes).
func (s *Server) Promote() {
	s.tb.Helper()
	s.run("pg_ctl", "-D", s.dataDir(), "-w", "-t", "60", "promote")
}

// Crash stops the server like a crash (pg_ctl stop -m immediate: every
// connection is dropped mid-transaction, no checkpoint; UNLOGGED tables are
// emptied by the recovery at the next start) and keeps its files, so Start
// can bring it back, or a standby can be promoted instead.
func (s *Server) Crash() {
	s.tb.Helper()
	if !s.up {
		return
	}
	s.run("pg_ctl", "-D", s.dataDir(), "-m", "immediate", "-w", "-t", "30", "stop")
	s.up = false
}

// Restart starts a server stopped by Crash again, on the same port.
func (s *Server) Restart() {
	s.tb.Helper()
	if s.up {
		return
	}
	if err := s.start(); err != nil {
		s.tb.Fatalf("testpg: restart: %v", err)
	}
	s.up = true
}

// Log returns the end of the server's log (at most n bytes), for failure
// messages.
func (s *Server) Log(n int) string {
	b, err := os.ReadFile(s.logFile())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(bytes.TrimSpace(tail(b, n)))
}
