package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold/etcdstore"
)

// checkEtcd validates the endpoints of etcd://[user:password@]host:port[,…]
// (etcds:// is rewritten to etcd:// before)
// more strictly than the etcd client does, so a typo is a bad URL rather
// than a connection timeout.
func checkEtcd(raw, desc string) error {
	_, rest, _ := strings.Cut(raw, "://")
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	hosts, _, _ := strings.Cut(rest, "?")
	hosts = strings.TrimSuffix(hosts, "/")
	if hosts == "" {
		return fmt.Errorf("%w: %q: no endpoint; want etcd://host:port[,host:port]", ErrBadURL, desc)
	}
	if strings.ContainsAny(hosts, "/#") {
		return fmt.Errorf("%w: %q: etcd URLs take no path; set the key prefix with ?prefix=", ErrBadURL, desc)
	}
	for _, ep := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			return fmt.Errorf("%w: %q: endpoint %q is not host:port", ErrBadURL, desc, ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return fmt.Errorf("%w: %q: endpoint %q needs a host and a port between 1 and 65535", ErrBadURL, desc, ep)
		}
	}
	if _, _, err := etcdstore.ParseURL(raw); err != nil {
		return fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	return nil
}

// etcdDialTimeout bounds connecting (and authenticating) to etcd.
const etcdDialTimeout = 5 * time.Second

// openEtcd connects to etcd and checks that a quorum answers, with a dial
// timeout, because authenticating a user blocks in clientv3.New otherwise.
func openEtcd(ctx context.Context, raw, desc string, c common) (*Opened, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	raw = "etcd://" + rest
	if err := checkEtcd(raw, desc); err != nil {
		return nil, err
	}
	cfg, prefix, err := etcdstore.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	if err := etcdTLS(&cfg, strings.EqualFold(scheme, "etcds"), c); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	if err := checkPrefix(prefix, desc); err != nil {
		return nil, err
	}
	if prefix == "" {
		prefix = etcdstore.DefaultPrefix
	}
	dctx, cancel := context.WithTimeout(ctx, etcdDialTimeout)
	defer cancel()
	cfg.DialTimeout = etcdDialTimeout
	if dl, ok := dctx.Deadline(); ok {
		cfg.DialTimeout = max(time.Until(dl), time.Millisecond)
	}
	cfg.Context = context.WithoutCancel(ctx)
	st, err := etcdstore.OpenConfig(dctx, cfg, etcdstore.Options{Prefix: prefix})
	switch {
	case errors.Is(err, etcdstore.ErrInvalidOptions):
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	case err != nil:
		return nil, openFailed(desc, err)
	}
	// Close closes the client OpenConfig dialled.
	return &Opened{Store: st, Kind: Etcd, Shared: true, closers: []io.Closer{st}, Warnings: c.warnings()}, nil
}

// etcdTLS sets up TLS for an etcds:// URL: https endpoints (gRPC checks
// each member's certificate against the member's host name) and the URL's
// CA, client certificate and key.
func etcdTLS(cfg *clientv3.Config, on bool, c common) error {
	if !on {
		if c.wantsTLS() {
			return errors.New("ca_file, cert_file, key_file and skip_verify need etcds:// (TLS)")
		}
		return nil
	}
	t, err := c.tlsConfig("")
	if err != nil {
		return err
	}
	cfg.TLS = t
	for i, ep := range cfg.Endpoints {
		cfg.Endpoints[i] = "https://" + ep
	}
	return nil
}
