package storeurl

import (
	"context"
	"fmt"
)

// dialEtcd is replaced by the etcdstore opener once that package exists.
func dialEtcd(_ context.Context, _ []string, desc string) (*Opened, error) {
	return nil, fmt.Errorf("%w: %q: the etcd store is not part of this build yet", ErrBadURL, desc)
}
