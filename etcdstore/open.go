package etcdstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// dialTimeout bounds the connection attempt of Open when ctx has no deadline.
const dialTimeout = 5 * time.Second

// Open dials the etcd members at endpoints ("host:port" or
// "http://host:port"), checks that the cluster answers a linearizable read
// within ctx (or 5 s), and returns a Store whose Close also closes the
// client. The client logs nothing.
func Open(ctx context.Context, endpoints []string, opts Options) (*Store, error) {
	return OpenConfig(ctx, clientv3.Config{Endpoints: endpoints}, opts)
}

// OpenConfig is Open with a client configuration of the caller's: its
// endpoints, credentials and TLS. Errors of Open, OpenURL and OpenConfig
// are classified as the Store's are: leasehold.ErrAccessDenied for refused
// credentials or permissions, leasehold.ErrUnavailable for an outage, and
// leasehold.ErrMisconfigured for anything else (TLS, a port that does not
// speak etcd).
func OpenConfig(ctx context.Context, cfg clientv3.Config, opts Options) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrInvalidOptions)
	}
	if slices.Contains(cfg.Endpoints, "") {
		return nil, fmt.Errorf("%w: empty etcd endpoint", ErrInvalidOptions)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, dialTimeout)
		defer cancel()
	}
	cfg.Logger = zap.NewNop()
	if dl, ok := ctx.Deadline(); ok && cfg.DialTimeout == 0 {
		// With credentials, clientv3.New authenticates while it dials; without
		// a dial timeout that blocks past ctx on an unreachable endpoint.
		cfg.DialTimeout = max(time.Until(dl), time.Millisecond)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, classified("connect to "+strings.Join(cfg.Endpoints, ","), err)
	}
	// A linearizable read proves a quorum answers (and that auth works, for
	// a user whose role covers the prefix only).
	if _, err := cli.Get(ctx, cmp.Or(opts.Prefix, DefaultPrefix), clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		if perr := probeTLS(cfg); perr != nil {
			err = perr
		}
		return nil, classified("etcd at "+strings.Join(cfg.Endpoints, ",")+" does not answer", err)
	}
	s, err := New(cli, opts)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	s.owned = true
	if cfg.TLS == nil {
		s.probe = func() error { return probeTLS(cfg) } // reports only a port that speaks TLS
	}
	return s, nil
}

// OpenURL opens the store named by a URL of the form
//
//	etcd://[user:password@]host:port[,host:port...][?prefix=leasehold/]
//
// as `leasehold --store` takes it. The prefix query parameter overrides
// opts.Prefix. The password is sent to etcd only and never appears in errors.
func OpenURL(ctx context.Context, rawURL string, opts Options) (*Store, error) {
	cfg, prefix, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if prefix != "" {
		opts.Prefix = prefix
	}
	return OpenConfig(ctx, cfg, opts)
}

// ParseURL parses an etcd:// store URL (see OpenURL) into a client
// configuration (endpoints and credentials) and a key prefix ("" when not
// given). Errors never contain the password.
func ParseURL(rawURL string) (clientv3.Config, string, error) {
	var cfg clientv3.Config
	rest, ok := strings.CutPrefix(rawURL, "etcd://")
	if !ok {
		return cfg, "", fmt.Errorf("%w: store URL must start with etcd://", ErrInvalidOptions)
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		user, pass, hasPass := strings.Cut(rest[:i], ":")
		if user == "" {
			return cfg, "", fmt.Errorf("%w: etcd URL has credentials without a user name", ErrInvalidOptions)
		}
		u, err1 := url.PathUnescape(user)
		p, err2 := url.PathUnescape(pass)
		if err1 != nil || err2 != nil || !hasPass {
			return cfg, "", fmt.Errorf("%w: etcd URL credentials must be user:password (percent-encoded)", ErrInvalidOptions)
		}
		cfg.Username, cfg.Password = u, p
		rest = rest[i+1:]
	}
	hosts, query, _ := strings.Cut(rest, "?")
	var err error
	if cfg.Endpoints, err = parseHosts(hosts); err != nil {
		return cfg, "", err
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return cfg, "", fmt.Errorf("%w: etcd URL query: %v", ErrInvalidOptions, err)
	}
	prefix := q.Get("prefix")
	for k := range q {
		if k != "prefix" {
			return cfg, "", fmt.Errorf("%w: unknown etcd URL parameter %q (known: prefix)", ErrInvalidOptions, k)
		}
	}
	return cfg, prefix, nil
}

// parseHosts parses the comma-separated host:port list of an etcd:// URL.
func parseHosts(hosts string) ([]string, error) {
	hosts = strings.TrimSuffix(hosts, "/")
	if strings.Contains(hosts, "/") {
		return nil, fmt.Errorf("%w: etcd URL takes no path; set the key prefix with ?prefix=", ErrInvalidOptions)
	}
	var out []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if _, port, ok := strings.Cut(h, ":"); !ok || port == "" {
			return nil, fmt.Errorf("%w: etcd endpoint %q needs host:port", ErrInvalidOptions, h)
		}
		out = append(out, h)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: etcd URL has no host:port", ErrInvalidOptions)
	}
	return out, nil
}

// probeTLS explains a first read that failed: gRPC reports a failed TLS
// handshake as a connection it keeps retrying, so the read only times out.
// probeTLS dials the first endpoint and shakes hands as the client would
// (with cfg.TLS), or, without TLS, checks whether the port speaks TLS. It
// returns the handshake's error, or nil when the probe proves nothing (no
// connection, a handshake that worked or got no answer).
func probeTLS(cfg clientv3.Config) error {
	ep := cfg.Endpoints[0]
	if i := strings.Index(ep, "://"); i >= 0 {
		ep = ep[i+3:]
	}
	host, _, err := net.SplitHostPort(ep)
	if err != nil {
		return nil
	}
	conn, err := net.DialTimeout("tcp", ep, probeTimeout)
	if err != nil {
		return nil
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	tc := &tls.Config{InsecureSkipVerify: true} // only to learn whether the port speaks TLS
	if cfg.TLS != nil {
		tc = cfg.TLS.Clone()
		if tc.ServerName == "" {
			tc.ServerName = host
		}
	}
	return handshakeError(tls.Client(conn, tc), ep, cfg.TLS != nil)
}

// handshakeError shakes hands on c with endpoint ep and returns what the
// handshake proves wrong, if anything; withTLS: the client uses TLS.
func handshakeError(c *tls.Conn, ep string, withTLS bool) error {
	err := c.Handshake()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return nil
	case err != nil && withTLS:
		return fmt.Errorf("TLS handshake with %s: %w", ep, err)
	case err == nil && !withTLS:
		return fmt.Errorf("%s speaks TLS (https): use etcds:// with its CA", ep)
	case err == nil && c.ConnectionState().Version == tls.VersionTLS13:
		// TLS 1.3 refuses a client certificate after the handshake.
		if _, err := c.Read(make([]byte, 1)); err != nil && strings.Contains(err.Error(), "remote error: tls:") {
			return fmt.Errorf("TLS with %s: %w", ep, err)
		}
	}
	return nil
}

// probeTimeout bounds each step of probeTLS.
const probeTimeout = 2 * time.Second
