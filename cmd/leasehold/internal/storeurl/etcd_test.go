package storeurl_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/driver"
)

func TestOpenEtcd(t *testing.T) {
	c := testetcd.Start(t)
	ctx := t.Context()
	var eps []string
	for _, ep := range c.Endpoints() {
		eps = append(eps, strings.TrimPrefix(ep, "http://"))
	}
	o, err := storeurl.Open(ctx, "etcd://"+strings.Join(eps, ",")+"?prefix=cli-test/")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Kind != storeurl.Etcd || !o.Shared {
		t.Errorf("expected a shared etcd store, got %s %v", o.Kind, o.Shared)
	}
	g, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "job", Token: "tok", TTL: 5 * time.Second})
	if err != nil || g.Fence == 0 {
		t.Fatalf("acquire: fence %d, %v", g.Fence, err)
	}
	li, err := o.Store.(driver.Inspector).Inspect(ctx, "job")
	if err != nil || li.Token != "tok" {
		t.Errorf("inspect: expected token tok, got %+v, %v", li, err)
	}
}

func TestOpenEtcdUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := storeurl.Open(ctx, "etcd://user:"+secret+"@127.0.0.1:1")
	if !errors.Is(err, storeurl.ErrUnavailable) || errors.Is(err, storeurl.ErrBadURL) {
		t.Errorf("expected ErrUnavailable, got %v", err)
	}
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the password: %v", err)
	}
}
