package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/pgstore"
)

// pgConnectTimeout bounds connecting to PostgreSQL (and creating the table).
const pgConnectTimeout = 5 * time.Second

// openPostgres opens a postgres:// or postgresql:// URL with pgstore.Open,
// after taking out our own parameters (table, schema, migrate); the rest is
// pgx's (sslmode, connect_timeout, pool_max_conns, …).
func openPostgres(ctx context.Context, raw, desc string, c common) (*Opened, error) {
	dsn, opts, err := postgresParams(raw, desc, c)
	if err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, pgConnectTimeout)
	defer cancel()
	st, err := pgstore.Open(octx, dsn, opts)
	switch {
	case errors.Is(err, leasehold.ErrInvalidOptions):
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	case err != nil:
		return nil, openFailed(desc, err)
	}
	// Close stops the LISTEN connection and closes the pool Open created.
	return &Opened{Store: st, Kind: Postgres, Shared: true, closers: []io.Closer{st}, Warnings: append(c.warnings(), plaintextWarning(dsn)...)}, nil
}

// plaintextWarning warns when dsn names a TCP host without sslmode: libpq's
// default, prefer, falls back to plaintext (password included) when the
// server or a man in the middle declines TLS.
func plaintextWarning(dsn string) []string {
	u, err := url.Parse(dsn)
	if err != nil || u.Query().Has("sslmode") || u.Host == "" || strings.HasPrefix(u.Query().Get("host"), "/") {
		return nil
	}
	return []string{"no sslmode: PostgreSQL's default (prefer) may fall back to plaintext, password included; set ca_file= (sslmode=verify-full), or sslmode=disable on a network you trust"}
}

// PostgresConfig parses a postgres:// or postgresql:// URL as Open does
// (password_file, the TLS parameters, table, schema, migrate) without
// connecting, for a caller that builds its own pool: the pool's
// configuration, with sessions pinned to READ COMMITTED as pgstore.Open
// pins them, and the store's options. No error contains the password.
func PostgresConfig(raw string, getenv func(string) string) (*pgxpool.Config, pgstore.Options, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	raw = strings.TrimSpace(raw)
	secrets := secretsOf(raw)
	desc := Describe(raw)
	scheme, _, _ := strings.Cut(raw, "://")
	if s := strings.ToLower(scheme); s != "postgres" && s != "postgresql" {
		return nil, pgstore.Options{}, fmt.Errorf("%w: %s is not a postgres:// URL", ErrBadURL, quoteDesc(desc))
	}
	cfg, opts, err := postgresConfig(raw, desc, &secrets, getenv)
	return cfg, opts, redact(err, secrets, desc)
}

func postgresConfig(raw, desc string, secrets *[]string, getenv func(string) string) (*pgxpool.Config, pgstore.Options, error) {
	raw, c, err := prepare(raw, desc, secrets, getenv)
	if err != nil {
		return nil, pgstore.Options{}, err
	}
	dsn, opts, err := postgresParams(raw, desc, c)
	if err != nil {
		return nil, opts, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, opts, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	return cfg, opts, nil
}

// postgresParams takes our own parameters (table, schema, migrate, the TLS
// files) out of a postgres URL: the rest, for pgx, and the store's options.
func postgresParams(raw, desc string, c common) (string, pgstore.Options, error) {
	var opts pgstore.Options
	u, err := parseURL(raw, desc)
	if err != nil {
		return "", opts, err
	}
	q := u.Query()
	for _, p := range []struct {
		name string
		dst  *string
	}{{"table", &opts.Table}, {"schema", &opts.Schema}} {
		if !q.Has(p.name) {
			continue
		}
		if *p.dst = q.Get(p.name); *p.dst == "" {
			return "", opts, fmt.Errorf("%w: %q: %s= is empty; leave it out for the default", ErrBadURL, desc, p.name)
		}
		q.Del(p.name)
	}
	if q.Has("migrate") {
		m, err := strconv.ParseBool(q.Get("migrate"))
		if err != nil {
			return "", opts, fmt.Errorf("%w: %q: migrate=%q: want true or false", ErrBadURL, desc, q.Get("migrate"))
		}
		opts.Migrate = pgstore.MigrateNever
		if m {
			opts.Migrate = pgstore.MigrateCreate
		}
		q.Del("migrate")
	}
	if err := pgTLS(q, c); err != nil {
		return "", opts, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	u.RawQuery = q.Encode()
	return u.String(), opts, nil
}

// pgTLS maps the common TLS parameters to libpq's: ca_file to sslrootcert,
// cert_file and key_file to sslcert and sslkey. With any of them and no
// sslmode, sslmode is verify-full (certificate and host name checked);
// ca_file with any other sslmode is refused; skip_verify means
// sslmode=require (encrypted, nothing checked).
func pgTLS(q url.Values, c common) error {
	for _, p := range []struct{ from, to string }{
		{c.caFile, "sslrootcert"}, {c.certFile, "sslcert"}, {c.keyFile, "sslkey"},
	} {
		if p.from != "" {
			q.Set(p.to, p.from)
		}
	}
	mode := q.Get("sslmode")
	switch {
	case c.skipVerify && (mode == "verify-ca" || mode == "verify-full"):
		return fmt.Errorf("skip_verify=true contradicts sslmode=%s", mode)
	case c.caFile != "" && !c.skipVerify && mode != "" && mode != "verify-full":
		return fmt.Errorf("ca_file= with sslmode=%s does not check the server's host name (disable, allow and prefer may not even use TLS): use sslmode=verify-full, or leave sslmode out", mode)
	case c.skipVerify:
		q.Set("sslmode", "require")
	case c.wantsTLS() && mode == "":
		q.Set("sslmode", "verify-full")
	}
	return nil
}
