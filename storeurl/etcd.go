package storeurl

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// parseEtcd returns the endpoints of etcd://host:port[,host:port…].
func parseEtcd(raw, desc string) ([]string, error) {
	_, rest, _ := strings.Cut(raw, "://")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		if tail := strings.Trim(rest[i:], "/"); tail != "" {
			return nil, fmt.Errorf("%w: %q: etcd URLs take no path or options, only etcd://host:port[,host:port]", ErrBadURL, desc)
		}
		rest = rest[:i]
	}
	if strings.Contains(rest, "@") {
		return nil, fmt.Errorf("%w: %q: credentials in etcd URLs are not supported; use etcd://host:port[,host:port]", ErrBadURL, desc)
	}
	if rest == "" {
		return nil, fmt.Errorf("%w: %q: no endpoint; want etcd://host:port[,host:port]", ErrBadURL, desc)
	}
	var eps []string
	for _, ep := range strings.Split(rest, ",") {
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: endpoint %q is not host:port", ErrBadURL, desc, ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return nil, fmt.Errorf("%w: %q: endpoint %q needs a host and a port between 1 and 65535", ErrBadURL, desc, ep)
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

func openEtcd(ctx context.Context, raw, desc string) (*Opened, error) {
	eps, err := parseEtcd(raw, desc)
	if err != nil {
		return nil, err
	}
	return dialEtcd(ctx, eps, desc)
}
