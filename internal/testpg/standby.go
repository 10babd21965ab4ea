package testpg

import "context"

// StartStandby copies the running server s with pg_basebackup (-R writes
// the standby configuration: primary_conninfo and standby.signal) and starts
// the copy as a streaming standby on its own free loopback port. t.Cleanup
// stops it and removes its files. The standby answers read-only queries
// until Promote.
func (s *Server) StartStandby() *Server {
	s.tb.Helper()
	p, err := s.p.StartStandby(context.Background())
	if err != nil {
		s.tb.Fatalf("testpg: start the standby: %v", err)
	}
	return wrap(s.tb, p)
}

// Promote turns a standby into a primary (pg_ctl promote, waiting until it
// accepts writes).
func (s *Server) Promote() {
	s.tb.Helper()
	if err := s.p.Promote(context.Background()); err != nil {
		s.tb.Fatalf("testpg: %v", err)
	}
}

// Crash stops the server like a crash (pg_ctl stop -m immediate: every
// connection is dropped mid-transaction, no checkpoint; UNLOGGED tables are
// emptied by the recovery at the next start) and keeps its files, so
// Restart can bring it back, or a standby can be promoted instead.
func (s *Server) Crash() {
	s.tb.Helper()
	if err := s.p.Crash(context.Background()); err != nil {
		s.tb.Fatalf("testpg: %v", err)
	}
}

// Restart starts a server stopped by Crash again, on the same port.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.p.Restart(context.Background()); err != nil {
		s.tb.Fatalf("testpg: restart: %v", err)
	}
}

// Log returns the end of the server's log (at most n bytes), for failure
// messages.
func (s *Server) Log(n int) string { return s.p.Log(n) }
