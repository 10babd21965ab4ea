package etcdstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// A TTL longer than etcd's maximum lease TTL is a configuration error with
// a message that says so, never an outage.
func TestTooLargeTTLIsMisconfigured(t *testing.T) {
	_, _, s, ctx := startStore(t, 10*time.Second)
	_, err := s.Acquire(ctx, driver.AcquireRequest{Key: uniqueKey(t, ""), Token: "t", TTL: 2_550_000 * time.Hour})
	if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrUnavailable) {
		t.Fatalf("expected ErrMisconfigured, got %v", err)
	}
	if !strings.Contains(err.Error(), "9,000,000,000 s") {
		t.Fatalf("expected the error to name etcd's maximum TTL, got %v", err)
	}
}

// Open classifies its errors as the Store does: refused credentials and a
// role without the prefix are ErrAccessDenied, a refused port an outage.
func TestOpenClassifiesErrors(t *testing.T) {
	c := testetcd.Start(t)
	enableAuth(t, c)
	ep := strings.TrimPrefix(c.Endpoints()[0], "http://")
	for _, tc := range []struct {
		name, url string
		want      error
	}{
		{"wrong password", "etcd://app:wrongpw@" + ep + "?prefix=other/", leasehold.ErrAccessDenied},
		{"no credentials", "etcd://" + ep + "?prefix=other/", leasehold.ErrAccessDenied},
		{"role without the prefix", "etcd://app:apppw@" + ep + "?prefix=mine/", leasehold.ErrAccessDenied},
		{"refused port", "etcd://127.0.0.1:1", leasehold.ErrUnavailable},
	} {
		s, err := etcdstore.OpenURL(ctxFor(t, 5*time.Second), tc.url, etcdstore.Options{})
		if err == nil {
			_ = s.Close()
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: expected %v, got %v", tc.name, tc.want, err)
		}
		if tc.want == leasehold.ErrUnavailable && errors.Is(err, leasehold.ErrMisconfigured) {
			t.Errorf("%s: expected an outage, got a configuration error: %v", tc.name, err)
		}
		if err != nil && strings.Contains(err.Error(), "wrongpw") {
			t.Errorf("%s: the error shows the password: %v", tc.name, err)
		}
	}
}
