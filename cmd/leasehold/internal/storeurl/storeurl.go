// Package storeurl opens a driver.Store from a URL, as the leasehold
// command line takes it in --store or LEASEHOLD_STORE:
//
//	memory                                   the embedded, in-process store
//	redis://[user:password@]host:port[/db][?prefix=P&functions=true&<go-redis options>]
//	rediss://…                               the same over TLS
//	redis://host:port?addr=host2:port2&addr=…  a Redis Cluster (go-redis ParseClusterURL)
//	redis://sentinel:port?master_name=M&addr=sentinel2:port…  Redis Sentinel (go-redis ParseFailoverURL)
//	etcd://[user:password@]host:port[,host:port…][?prefix=P]  an etcd cluster
//	etcds://…                                the same over TLS
//	postgres://[user:password@]host:port/db[?sslmode=…&table=T&schema=S&migrate=false]
//	postgresql://…                           the same
//
// Every URL also takes password_file=PATH (the password, from a file rather
// than the URL; $LEASEHOLD_STORE_PASSWORD_FILE does the same for a URL
// without a password), and, over TLS, ca_file=, cert_file= and key_file=
// (mutual TLS) and skip_verify=true (accepted with a warning in
// Opened.Warnings). For PostgreSQL the TLS files map to sslrootcert, sslcert
// and sslkey, and imply sslmode=verify-full.
//
// The prefix query parameter sets the key prefix of the store; functions=true
// calls redisstore's scripts with FCALL (load them first with
// LoadRedisFunctions); every other query parameter of a Redis URL is
// go-redis's (dial_timeout, read_timeout, …).
// For PostgreSQL, table and schema name the lock table (default
// public.leasehold_locks), migrate=false skips creating it (for a user
// without the CREATE privilege), and every other parameter is pgx's
// (sslmode, connect_timeout, pool_max_conns, …).
//
// Passwords never appear in what this package returns: Describe masks
// them, also in malformed URLs and libpq key=value strings, and every error
// is scrubbed of them and of every piece of them of 3 or more characters.
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// Errors, matched with errors.Is.
var (
	// ErrBadURL is wrapped by every error about a URL that cannot be used.
	ErrBadURL = errors.New("storeurl: bad store URL")
	// ErrUnknownScheme is returned for a scheme this package does not know;
	// it also matches ErrBadURL.
	ErrUnknownScheme = fmt.Errorf("%w: unknown scheme", ErrBadURL)
	// ErrUnavailable is returned by Open for a well-formed URL whose store
	// did not answer (etcd and PostgreSQL are dialled at open; Redis is not):
	// an outage (leasehold.ErrUnavailable). A store that answered with a
	// refusal, or failed in a way not known to be an outage, returns an
	// error wrapping leasehold.ErrMisconfigured (leasehold.ErrAccessDenied
	// for credentials and permissions) instead.
	ErrUnavailable = errors.New("storeurl: store unavailable")
)

// openFailed wraps an error of dialling a store at open: ErrUnavailable for
// an outage, leasehold.ErrMisconfigured (as the store classified it, or
// for an error it did not classify) for anything else.
func openFailed(desc string, err error) error {
	switch {
	case errors.Is(err, leasehold.ErrUnavailable):
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, desc, err)
	case errors.Is(err, leasehold.ErrMisconfigured), errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", desc, err)
	}
	return fmt.Errorf("%s: %w: %w", desc, leasehold.ErrMisconfigured, err)
}

// Kind names a kind of store.
type Kind string

// Kinds of store.
const (
	Memory   Kind = "memory"
	Redis    Kind = "redis"
	Etcd     Kind = "etcd"
	Postgres Kind = "postgres"
)

// Supported lists the accepted URL forms, for error messages and help.
const Supported = "memory, redis://host:port, rediss://host:port (TLS), redis://host:port?addr=host:port (Cluster), redis://sentinel:port?master_name=M&addr=sentinel:port (Sentinel), etcd://host:port[,host:port], etcds://host:port (TLS), postgres://user@host:port/db"

// Opened is an open store. Close it when done.
type Opened struct {
	// Store is the lock store.
	Store driver.Store
	// Kind of the store.
	Kind Kind
	// Shared reports whether the store excludes holders in different
	// processes: false for the in-process memory store.
	Shared bool
	// Desc is the URL with its password redacted, safe to print.
	Desc string
	// Warnings are about the URL's settings (skip_verify=true), for the
	// caller to print.
	Warnings []string

	secrets []string
	closers []io.Closer
}

// Close closes the store and its client.
func (o *Opened) Close() error {
	var errs []error
	for _, c := range o.closers {
		if err := c.Close(); err != nil && !errors.Is(err, errClientClosed) {
			errs = append(errs, err)
		}
	}
	o.closers = nil
	return o.Redact(errors.Join(errs...))
}

// Redact returns err with every secret of the URL (its password) replaced,
// or nil for nil. Use it on any store error that reaches output.
func (o *Opened) Redact(err error) error {
	return redact(err, o.secrets, o.Desc)
}

// Open parses raw and opens the store it names. A Redis store is not
// contacted (failures surface on first use); etcd and PostgreSQL are, and
// one that does not answer returns an error wrapping ErrUnavailable. An unusable
// URL returns an error wrapping ErrBadURL (ErrUnknownScheme for an unknown
// scheme) that names the problem. No error contains the password.
func Open(ctx context.Context, raw string) (*Opened, error) {
	return OpenEnv(ctx, raw, os.Getenv)
}

// OpenEnv is Open with the environment read through getenv (for
// $LEASEHOLD_STORE_PASSWORD_FILE).
func OpenEnv(ctx context.Context, raw string, getenv func(string) string) (*Opened, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	raw = strings.TrimSpace(raw)
	secrets := secretsOf(raw)
	desc := Describe(raw)
	o, err := open(ctx, raw, desc, &secrets, getenv)
	if err != nil {
		return nil, redact(err, secrets, desc)
	}
	o.Desc, o.secrets = desc, secrets
	return o, nil
}

func open(ctx context.Context, raw, desc string, secrets *[]string, getenv func(string) string) (*Opened, error) {
	if raw == "" {
		return nil, fmt.Errorf("%w: empty; want one of: %s", ErrBadURL, Supported)
	}
	if raw == "memory" || raw == "memory://" || raw == "mem" {
		return &Opened{Store: memstore.New(), Kind: Memory}, nil
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("%w: %s has no scheme; want one of: %s", ErrBadURL, quoteDesc(desc), Supported)
	}
	scheme = strings.ToLower(scheme)
	if !knownScheme(scheme) {
		if scheme == "memory" {
			return nil, fmt.Errorf("%w: the memory store takes no address: write just \"memory\"", ErrBadURL)
		}
		return nil, fmt.Errorf("%w %s in %q; want one of: %s", ErrUnknownScheme, quoteScheme(scheme), desc, Supported)
	}
	raw, c, err := prepare(raw, desc, secrets, getenv)
	if err != nil {
		return nil, err
	}
	switch scheme {
	case "redis", "rediss", "unix":
		return openRedis(ctx, raw, desc, c)
	case "etcd", "etcds":
		return openEtcd(ctx, raw, desc, c)
	}
	return openPostgres(ctx, raw, desc, c)
}

func knownScheme(s string) bool {
	switch s {
	case "redis", "rediss", "unix", "etcd", "etcds", "postgres", "postgresql":
		return true
	}
	return false
}

// quoteScheme quotes an unknown scheme only when it looks like one: text
// before "://" in a mangled URL may be anything, a password included.
func quoteScheme(s string) string {
	if validScheme(s) {
		return strconv.Quote(s)
	}
	return "(not a scheme)"
}

// quoteDesc quotes a description of a string that is not a URL, unless it
// may carry a secret that Describe could not find: then it is left out.
func quoteDesc(desc string) string {
	if strings.ContainsAny(desc, "@=") && !strings.Contains(desc, mask) {
		return "the store URL"
	}
	return strconv.Quote(desc)
}

// prepare takes out the parameters common to every scheme and puts the
// password of a password file (the URL's password_file= or
// $LEASEHOLD_STORE_PASSWORD_FILE) into the URL, adding it to secrets.
func prepare(raw, desc string, secrets *[]string, getenv func(string) string) (string, common, error) {
	raw, c, err := takeCommon(raw, desc)
	if err != nil {
		return "", c, err
	}
	file := c.passwordFile
	if file == "" && !hasPassword(raw) {
		file = getenv(EnvPasswordFile)
	}
	if file == "" {
		return raw, c, nil
	}
	raw, pw, err := withPassword(raw, desc, file)
	if err != nil {
		return "", c, err
	}
	*secrets = append(*secrets, secretsOf(raw)...)
	*secrets = append(*secrets, pw)
	return raw, c, nil
}
