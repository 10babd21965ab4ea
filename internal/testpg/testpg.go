// Package testpg starts a real PostgreSQL server for tests on a free loopback
// port, in its own temporary data directory, and stops it when the test ends.
//
// `make test` installs PostgreSQL (scripts/install-test-deps.sh); a test
// using this package fails, with a message saying so, when initdb or pg_ctl
// is missing. PostgreSQL refuses to run as root: when the test runs as uid 0
// the server runs as the "postgres" user (created by the Debian package), and
// the data directory is handed to that user.
//
// The server is tuned for tests, not durability: fsync, synchronous_commit
// and full_page_writes are off, and every loopback connection is trusted.
package testpg

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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Superuser is the database superuser the server is initialised with.
const Superuser = "postgres"

// Server is one running PostgreSQL server.
type Server struct {
	// Port is the loopback TCP port the server listens on.
	Port int
	// Dir is the temporary directory holding the data directory, the unix
	// socket and the log; it is removed by Stop.
	Dir string

	bin  string // directory holding initdb, pg_ctl and postgres
	cred *syscall.Credential
	tb   testing.TB
	up   bool
}

// Bin returns the directory that holds initdb and pg_ctl, or fails the test
// with a message saying how to install PostgreSQL. It looks at $PATH first,
// then at Debian's /usr/lib/postgresql/<version>/bin (newest version first).
func Bin(tb testing.TB) string {
	tb.Helper()
	dir, err := findBin()
	if err != nil {
		tb.Fatalf("testpg: %v: run `make test` or scripts/install-test-deps.sh (Debian package postgresql)", err)
	}
	return dir
}

func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if isExec(filepath.Join(dir, "pg_ctl")) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL not found (no initdb and pg_ctl in $PATH or /usr/lib/postgresql/*/bin)")
}

func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Start initialises a fresh cluster and starts PostgreSQL on a free loopback
// port; t.Cleanup stops it (pg_ctl stop -m immediate) and removes its files.
// Start takes about a second.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{bin: Bin(tb), tb: tb}
	if os.Geteuid() == 0 {
		s.cred = postgresUser(tb)
	}
	s.Dir = s.mkdir()
	tb.Cleanup(s.Stop)

	s.run("initdb", "-D", s.dataDir(), "-U", Superuser, "--auth=trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions")

	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // the free port may be taken in between
		s.Port = freePort(tb)
		if lastErr = s.start(); lastErr == nil {
			s.up = true
			return s
		}
	}
	tb.Fatalf("testpg: start PostgreSQL: %v", lastErr)
	return nil
}

// postgresUser returns the credentials of the "postgres" user, as root must
// not run the server.
func postgresUser(tb testing.TB) *syscall.Credential {
	tb.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		tb.Fatalf("testpg: running as root and there is no `postgres` user to run PostgreSQL as (%v): "+
			"run `make test` or scripts/install-test-deps.sh (Debian package postgresql creates it)", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		tb.Fatalf("testpg: user postgres has non-numeric uid %q / gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
}

// mkdir creates the server's directory. When the server runs as another
// user, the directory is chowned to it and placed under a parent that user
// can traverse (t.TempDir may sit below a 0700 directory).
func (s *Server) mkdir() string {
	s.tb.Helper()
	parent := os.TempDir()
	if s.cred != nil && !traversable(parent) {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "testpg-")
	if err != nil {
		s.tb.Fatalf("testpg: %v", err)
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			s.tb.Fatalf("testpg: hand %s to user postgres: %v", dir, err)
		}
	}
	return dir
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

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "data") }

func (s *Server) logFile() string { return filepath.Join(s.Dir, "postgres.log") }

// command builds a command for one of the PostgreSQL binaries, run as the
// postgres user when we are root.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

func (s *Server) run(name string, args ...string) {
	s.tb.Helper()
	var out bytes.Buffer
	cmd := s.command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		s.tb.Fatalf("testpg: %s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
}

func (s *Server) start() error {
	opts := strings.Join([]string{
		"-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + s.Dir,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=100",
	}, " ")
	var out bytes.Buffer
	cmd := s.command("pg_ctl", "-D", s.dataDir(), "-l", s.logFile(), "-o", opts, "-w", "-t", "60", "start")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(s.logFile())
		return fmt.Errorf("pg_ctl start on port %d: %v\n%s\n%s", s.Port, err, out.String(), tail(log, 2000))
	}
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testpg: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Stop stops the server at once (pg_ctl stop -m immediate: no checkpoint,
// like a crash) and removes its files. It is called by t.Cleanup and is a
// no-op when the server is not running.
func (s *Server) Stop() {
	if s.up {
		s.up = false
		var out bytes.Buffer
		cmd := s.command("pg_ctl", "-D", s.dataDir(), "-m", "immediate", "-w", "-t", "30", "stop")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			s.tb.Errorf("testpg: pg_ctl stop: %v\n%s", err, out.String())
		}
	}
	if s.Dir != "" {
		_ = os.RemoveAll(s.Dir)
		s.Dir = ""
	}
}

// DSN returns a connection string for database "postgres" as the superuser,
// over loopback TCP without TLS.
func (s *Server) DSN() string {
	return s.DatabaseDSN("postgres")
}

// DatabaseDSN returns a connection string for database db.
func (s *Server) DatabaseDSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, s.Port, db)
}

// Pool returns a connection pool to database "postgres", closed in
// t.Cleanup.
func (s *Server) Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return Connect(tb, s.DSN())
}

// Connect returns a connection pool for dsn, pinged once and closed in
// t.Cleanup.
func Connect(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		tb.Fatalf("testpg: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("testpg: ping: %v", err)
	}
	return pool
}

var dbSeq atomic.Uint64

// CreateDatabase creates a fresh, uniquely named database and returns its
// DSN: cheaper than a new server when tests need isolation.
func (s *Server) CreateDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("test_%d_%d", time.Now().UnixNano(), dbSeq.Add(1))
	pool := s.Pool(tb)
	if _, err := pool.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("testpg: create database %s: %v", name, err)
	}
	return s.DatabaseDSN(name)
}
