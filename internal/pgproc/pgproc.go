// Package pgproc runs PostgreSQL servers as child processes on free loopback
// ports: a primary from a fresh initdb, a streaming standby copied from it
// with pg_basebackup, a crash (pg_ctl stop -m immediate), a restart and a
// promotion. It is the one launcher behind the tests' helper
// (internal/testpg) and the drill's --store postgres-server mode.
//
// It finds the binaries on PATH or under /usr/lib/postgresql/*/bin (newest
// version first). PostgreSQL refuses to run as root: when the caller is root
// the server runs as the "postgres" user (created by the Debian package),
// which owns the server's directory.
package pgproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Superuser is the database superuser a server is initialised with; every
// loopback connection is trusted.
const Superuser = "postgres"

// ErrNotInstalled means a PostgreSQL binary, or the "postgres" user a root
// caller needs, is missing; the message says which.
var ErrNotInstalled = errors.New("pgproc: PostgreSQL is not installed (Debian package postgresql)")

// binaries are the programs the launcher runs.
var binaries = []string{"initdb", "pg_ctl", "postgres", "pg_basebackup"}

// startAttempts: the free port may be taken between the probe and the start.
const startAttempts = 3

// Options configure Start. The zero value is valid.
type Options struct {
	// Settings are extra server settings, each "name=value" (postgres -c),
	// e.g. "synchronous_commit=off".
	Settings []string
}

// Server is one PostgreSQL server. Crash, Restart and Promote are safe for
// concurrent use; Close is not (call it once the server is no longer used).
type Server struct {
	Port int
	Addr string // 127.0.0.1:PORT
	// Dir holds the data directory, the unix socket and the log; Close
	// removes it.
	Dir string

	bin      string
	cred     *syscall.Credential // the postgres user when the caller is root
	settings []string

	mu sync.Mutex
	up bool
}

// Bin returns the directory holding the PostgreSQL binaries: the one of
// initdb on PATH, else the newest /usr/lib/postgresql/*/bin that has them
// all. The error wraps ErrNotInstalled and names what is missing where.
func Bin() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(debian, func(i, j int) bool { return version(debian[i]) > version(debian[j]) })
	return binIn(append(dirs, debian...))
}

// binIn returns the first of dirs that holds every binary, or an error
// naming what each lacks.
func binIn(dirs []string) (string, error) {
	var problems []string
	for _, d := range dirs {
		missing := missingIn(d)
		if len(missing) == 0 {
			return d, nil
		}
		problems = append(problems, fmt.Sprintf("%s lacks %s", d, strings.Join(missing, ", ")))
	}
	if len(problems) == 0 {
		return "", fmt.Errorf("%w: no initdb on PATH and no /usr/lib/postgresql/*/bin", ErrNotInstalled)
	}
	return "", fmt.Errorf("%w: %s", ErrNotInstalled, strings.Join(problems, "; "))
}

func missingIn(dir string) []string {
	var missing []string
	for _, b := range binaries {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	return missing
}

func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// serverUser returns the credentials to run the server with: nil unless
// the caller is root, then the "postgres" user's.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running as root and there is no user \"postgres\" to run the server as: %v", ErrNotInstalled, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgproc: user postgres has uid %q, gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// Start initialises a fresh cluster in a new temporary directory and starts
// it on a free loopback port, waiting until it accepts connections. The
// server is tuned for throw-away data (fsync and full_page_writes off: safe
// against a process crash, not against the machine's); opts.Settings come
// on top.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, cred: cred, settings: opts.Settings}
	if err := s.mkdir(); err != nil {
		return nil, err
	}
	if err := s.run(ctx, "initdb", "-D", s.dataDir(), "-U", Superuser, "--auth=trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions"); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.startOnFreePort(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// StartStandby copies s with pg_basebackup (-R writes primary_conninfo and
// standby.signal; -X stream) and starts the copy as an asynchronous
// streaming standby on its own free port, with s's settings. It answers
// read-only queries until Promote.
func (s *Server) StartStandby(ctx context.Context) (*Server, error) {
	st := &Server{bin: s.bin, cred: s.cred, settings: s.settings}
	if err := st.mkdir(); err != nil {
		return nil, err
	}
	if err := st.run(ctx, "pg_basebackup", "-D", st.dataDir(), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port),
		"-U", Superuser, "-R", "-X", "stream", "--no-sync", "-c", "fast"); err != nil {
		st.Close()
		return nil, err
	}
	if err := st.startOnFreePort(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// mkdir creates the server's directory, handed to the server's user under a
// parent that user can traverse.
func (s *Server) mkdir() error {
	parent := os.TempDir()
	if s.cred != nil && !traversable(parent) {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "leasehold-pg-")
	if err != nil {
		return fmt.Errorf("pgproc: %w", err)
	}
	s.Dir = dir
	return s.chown(dir)
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
		return fmt.Errorf("pgproc: hand %s to user postgres: %w", path, err)
	}
	return nil
}

// traversable reports whether every directory from dir up to / can be
// entered by any user.
func traversable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// WriteFile writes data to name in the server's directory, owned by the
// server's user, and returns its path (e.g. a TLS certificate and key).
func (s *Server) WriteFile(name string, data []byte) (string, error) {
	p := filepath.Join(s.Dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("pgproc: %w", err)
	}
	return p, s.chown(p)
}

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "data") }
func (s *Server) logFile() string { return filepath.Join(s.Dir, "postgres.log") }

// run runs one of the PostgreSQL binaries as the server's user; the error
// carries its output.
func (s *Server) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgproc: %s %s: %w\n%s", name, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

func (s *Server) startOnFreePort(ctx context.Context) error {
	var err error
	for range startAttempts {
		if s.Port, err = freePort(); err != nil {
			return err
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		if err = s.start(ctx); err == nil {
			return nil
		}
	}
	return err
}

// start starts the server on s.Port and waits until it accepts connections.
func (s *Server) start(ctx context.Context) error {
	opts := []string{"-p", strconv.Itoa(s.Port)}
	for _, kv := range append([]string{
		"listen_addresses=127.0.0.1", "unix_socket_directories=" + s.Dir,
		"fsync=off", "full_page_writes=off", "max_connections=100",
	}, s.settings...) {
		opts = append(opts, "-c", kv)
	}
	err := s.run(ctx, "pg_ctl", "-D", s.dataDir(), "-l", s.logFile(), "-o", strings.Join(opts, " "), "-w", "-t", "60", "start")
	if err != nil {
		return fmt.Errorf("%w\n%s", err, s.Log(2000))
	}
	s.mu.Lock()
	s.up = true
	s.mu.Unlock()
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgproc: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Crash stops the server like a crash (pg_ctl stop -m immediate: every
// connection dropped mid-transaction, no checkpoint; crash recovery at the
// next start empties UNLOGGED tables) and keeps its files, for Restart, or
// for a standby's promotion instead. It is a no-op while stopped.
func (s *Server) Crash(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.up {
		return nil
	}
	if err := s.run(ctx, "pg_ctl", "-D", s.dataDir(), "-m", "immediate", "-w", "-t", "30", "stop"); err != nil {
		return err
	}
	s.up = false
	return nil
}

// Restart starts a crashed server again on its port and data directory.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	if up {
		return nil
	}
	return s.start(ctx)
}

// Promote turns a standby into a primary (pg_ctl promote), waiting until
// it accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	return s.run(ctx, "pg_ctl", "-D", s.dataDir(), "-w", "-t", "60", "promote")
}

// Close stops the server at once (as Crash) and removes its files. It is
// idempotent.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if s.Dir == "" {
		return
	}
	if _, err := os.Stat(filepath.Join(s.dataDir(), "postmaster.pid")); err == nil {
		s.mu.Lock()
		s.up = true // also a server whose start was cut short
		s.mu.Unlock()
	}
	_ = s.Crash(ctx)
	if s.Dir != "" {
		_ = os.RemoveAll(s.Dir)
		s.Dir = ""
	}
}

// DSN returns a connection string for database db as the superuser, over
// loopback TCP without TLS.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", Superuser, s.Addr, db)
}

// Log returns the end of the server's log (at most n bytes), for failure
// messages.
func (s *Server) Log(n int) string {
	b, err := os.ReadFile(s.logFile())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// Query runs sql in database db with psql (from the server's binary
// directory, else PATH) as the superuser over loopback TCP, and returns
// what psql printed: unaligned, tuples only, one row a line. It lets tests
// create databases and change settings without linking a PostgreSQL driver
// into the module that holds this package.
func (s *Server) Query(ctx context.Context, db, sql string) (string, error) {
	psql := filepath.Join(s.bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		if psql, err = exec.LookPath("psql"); err != nil {
			return "", fmt.Errorf("%w: no psql in %s or on PATH", ErrNotInstalled, s.bin)
		}
	}
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
		"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", Superuser, "-d", db, "-c", sql)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGCONNECT_TIMEOUT=10", "PGSSLMODE=disable")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("pgproc: psql %q: %w\n%s", sql, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return strings.TrimSpace(out.String()), nil
}
