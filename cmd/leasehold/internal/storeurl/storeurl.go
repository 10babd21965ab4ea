// Package storeurl opens a leasehold.Store from a URL, as the leasehold
// command line takes it in --store or LEASEHOLD_STORE:
//
//	memory                                   the embedded, in-process store
//	redis://[user:password@]host:port[/db][?prefix=P&<go-redis options>]
//	rediss://…                               the same over TLS
//	redis://host:port?addr=host2:port2&addr=…  a Redis Cluster (go-redis ParseClusterURL)
//	etcd://[user:password@]host:port[,host:port…][?prefix=P]  an etcd cluster
//	postgres://[user:password@]host:port/db[?sslmode=…&table=T&schema=S&migrate=false]
//	postgresql://…                           the same
//
// The prefix query parameter sets the key prefix of the store; every other
// query parameter of a Redis URL is go-redis's (dial_timeout, read_timeout, …).
// For PostgreSQL, table and schema name the lock table (default
// public.leasehold_locks), migrate=false skips creating it (for a user
// without the CREATE privilege), and every other parameter is pgx's
// (sslmode, connect_timeout, pool_max_conns, …).
//
// Passwords never appear in what this package returns: Describe redacts
// them, and every error is scrubbed of them.
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/leasehold/leasehold"
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
	// did not answer (etcd and PostgreSQL are dialled at open; Redis is not).
	ErrUnavailable = errors.New("storeurl: store unavailable")
)

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
const Supported = "memory, redis://host:port, rediss://host:port (TLS), redis://host:port?addr=host:port (Cluster), etcd://host:port[,host:port], postgres://user@host:port/db"

// Opened is an open store. Close it when done.
type Opened struct {
	// Store is the lock store.
	Store leasehold.Store
	// Kind of the store.
	Kind Kind
	// Shared reports whether the store excludes holders in different
	// processes: false for the in-process memory store.
	Shared bool
	// Desc is the URL with its password redacted, safe to print.
	Desc string

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
	return redact(err, o.secrets)
}

func redact(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := scrub(err.Error(), secrets)
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// redactedError keeps the error chain for errors.Is but prints the scrubbed
// message.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Open parses raw and opens the store it names. A Redis store is not
// contacted (failures surface on first use); etcd and PostgreSQL are, and
// one that does not answer returns an error wrapping ErrUnavailable. An unusable
// URL returns an error wrapping ErrBadURL (ErrUnknownScheme for an unknown
// scheme) that names the problem. No error contains the password.
func Open(ctx context.Context, raw string) (*Opened, error) {
	raw = strings.TrimSpace(raw)
	secrets := secretsOf(raw)
	desc := Describe(raw)
	o, err := open(ctx, raw, desc)
	if err != nil {
		return nil, redact(err, secrets)
	}
	o.Desc, o.secrets = desc, secrets
	return o, nil
}

func open(ctx context.Context, raw, desc string) (*Opened, error) {
	if raw == "" {
		return nil, fmt.Errorf("%w: empty; want one of: %s", ErrBadURL, Supported)
	}
	if raw == "memory" || raw == "memory://" || raw == "mem" {
		return &Opened{Store: memstore.New(), Kind: Memory}, nil
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("%w: %q has no scheme; want one of: %s", ErrBadURL, desc, Supported)
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		return openRedis(ctx, raw, desc)
	case "etcd":
		return openEtcd(ctx, raw, desc)
	case "postgres", "postgresql":
		return openPostgres(ctx, raw, desc)
	case "memory":
		return nil, fmt.Errorf("%w: the memory store takes no address: write just \"memory\"", ErrBadURL)
	}
	return nil, fmt.Errorf("%w %q in %q; want one of: %s", ErrUnknownScheme, scheme, desc, Supported)
}

// Describe returns raw with any password replaced by "xxxxx", for logs and
// output. It works on malformed URLs too.
func Describe(raw string) string {
	raw = strings.TrimSpace(raw)
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" {
		q := u.Query()
		changed := false
		for k := range q {
			if isSecretParam(k) {
				q.Set(k, "xxxxx")
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return redactRaw(raw)
}

// redactRaw redacts the userinfo of a URL that url.Parse rejects.
func redactRaw(raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	start := len(raw) - len(rest)
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		// A password with '/', '?' or '#' in it also ends up here; be safe.
		if at = strings.LastIndex(rest, "@"); at < 0 {
			return raw
		}
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return raw
	}
	return raw[:start] + user + ":xxxxx" + rest[at:]
}

func isSecretParam(k string) bool {
	k = strings.ToLower(k)
	return strings.Contains(k, "pass") || strings.Contains(k, "secret") || strings.Contains(k, "token")
}

// secretsOf returns the password(s) in raw, in raw and unescaped form.
func secretsOf(raw string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if u, err := url.PathUnescape(s); err == nil && u != s {
			out = append(out, u)
		}
		if u, err := url.QueryUnescape(s); err == nil && u != s {
			out = append(out, u)
		}
	}
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pass, ok := strings.Cut(rest[:at], ":"); ok {
				add(pass)
			}
		}
	}
	if u, err := url.Parse(raw); err == nil {
		if p, ok := u.User.Password(); ok {
			add(p)
		}
		for k, vs := range u.Query() {
			if isSecretParam(k) {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	return out
}

func scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		if len(s) > 0 {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}

// RedactError returns err's message without the secrets of the store URL
// raw (its password, secret query parameters). A url.Error is reduced to its
// cause first: it quotes the whole URL, escaped, where a plain search would
// miss the password.
func RedactError(err error, raw string) string {
	return scrub(parseErr(err), secretsOf(raw))
}

// parseErr describes a url.Parse failure without repeating the URL.
func parseErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}
