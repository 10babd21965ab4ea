package storeurl_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/driver"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/faultproxy"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/internal/testredis"
)

func TestMain(m *testing.M) { testetcd.VerifyTestMain(m) }

const secret = "hunter2pw"

func TestDescribe(t *testing.T) {
	tests := []struct{ in, want string }{
		{"memory", "memory"},
		{"redis://127.0.0.1:6379", "redis://127.0.0.1:6379"},
		{"redis://:" + secret + "@127.0.0.1:6379/2", "redis://:xxxxx@127.0.0.1:6379/2"},
		{"rediss://app:" + secret + "@h:6380?prefix=x:", "rediss://app:xxxxx@h:6380?prefix=x:"},
		{"redis://app:" + secret + "@h:notaport", "redis://app:xxxxx@h:notaport"},
		{"redis://app:" + secret + "@h:1?password=" + secret, "redis://app:xxxxx@h:1?password=xxxxx"},
		{"redis://app:hun/ter?2@h:1", "redis://app:xxxxx@h:1"},
		{"etcd://a:2379,b:2379", "etcd://a:2379,b:2379"},
		{"postgres://app:" + secret + "@db:5432/locks?sslmode=disable", "postgres://app:xxxxx@db:5432/locks?sslmode=disable"},
		{"postgresql://app:" + secret + "@db/locks?table=t", "postgresql://app:xxxxx@db/locks?table=t"},
		{"postgres://app@db/locks?password=" + secret, "postgres://app@db/locks?password=xxxxx"},
		{"postgres://app:" + secret + "@db:notaport/locks", "postgres://app:xxxxx@db:notaport/locks"},
	}
	for _, tt := range tests {
		got := storeurl.Describe(tt.in)
		if got != tt.want {
			t.Errorf("Describe(%q): expected %q, got %q", tt.in, tt.want, got)
		}
	}
}

func TestOpenRejects(t *testing.T) {
	ctx := t.Context()
	tests := []struct {
		url     string
		unknown bool
		mention string
	}{
		{"", false, "empty"},
		{"localhost:6379", false, "no scheme"},
		{"mysql://u:" + secret + "@h:3306/db", true, `"mysql"`},
		{"memory://somewhere", false, "no address"},
		{"redis://u:" + secret + "@h:notaport", false, "port"},
		{"redis://u:" + secret + "@h:6379/notadb", false, "database"},
		{"redis://u:" + secret + "@h:6379?bogus=1", false, "bogus"},
		{"redis://u:" + secret + "@h:6379?prefix=", false, "prefix"},
		{"redis://u:" + secret + "@h:6379?addr=h2:6379&bogus=1", false, "bogus"},
		{"redis://u:" + secret + "@h%zz:1", false, "escape"},
		{"etcd://", false, "no endpoint"},
		{"etcd://a", false, "not host:port"},
		{"etcd://a:0", false, "port"},
		{"etcd://a:2379,", false, `""`},
		{"etcd://u:" + secret + "@a:2379?bogus=1", false, "bogus"},
		{"etcd://:" + secret + "@a:2379", false, "user name"},
		{"etcd://a:2379/x", false, "no path"},
		{"postgres://u:" + secret + "@h:notaport/db", false, "port"},
		{"postgres://u:" + secret + "@h:5432/db?table=", false, "table"},
		{"postgres://u:" + secret + "@h:5432/db?schema=", false, "schema"},
		{"postgresql://u:" + secret + "@h:5432/db?migrate=maybe", false, "migrate"},
		{"postgres://u:" + secret + "@h:5432/db?sslmode=bogus", false, "sslmode"},
		{"postgres://u:" + secret + "@h:5432/db?table=" + strings.Repeat("t", 64), false, "at most 63"},
	}
	for _, tt := range tests {
		o, err := storeurl.Open(ctx, tt.url)
		if err == nil {
			_ = o.Close()
			t.Errorf("Open(%q): expected an error", storeurl.Describe(tt.url))
			continue
		}
		if !errors.Is(err, storeurl.ErrBadURL) {
			t.Errorf("Open(%q): expected ErrBadURL, got %v", storeurl.Describe(tt.url), err)
		}
		if errors.Is(err, storeurl.ErrUnknownScheme) != tt.unknown {
			t.Errorf("Open(%q): ErrUnknownScheme expected %v, got %v", storeurl.Describe(tt.url), tt.unknown, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open: error leaks the password: %v", err)
		}
		if !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("Open(%q): expected the error to mention %q, got %v", storeurl.Describe(tt.url), tt.mention, err)
		}
	}
}

func TestOpenMemory(t *testing.T) {
	o, err := storeurl.Open(t.Context(), "memory")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Kind != storeurl.Memory || o.Shared {
		t.Errorf("expected an unshared memory store, got kind %s shared %v", o.Kind, o.Shared)
	}
	if _, err := o.Store.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := t.Context()
	o, err := storeurl.Open(ctx, srv.URL()+"?prefix=cli-test:")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Kind != storeurl.Redis || !o.Shared {
		t.Errorf("expected a shared redis store, got kind %s shared %v", o.Kind, o.Shared)
	}
	g, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "job", Token: "tok", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g.Fence == 0 {
		t.Errorf("expected a fence > 0")
	}
	keys, err := srv.Client(t).Keys(ctx, "cli-test:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Errorf("expected keys under prefix cli-test:, got none")
	}
	if _, ok := o.Store.(driver.ForceReleaser); !ok {
		t.Errorf("redis store is not a ForceReleaser")
	}
}

func TestOpenRedisCluster(t *testing.T) {
	o, err := storeurl.Open(t.Context(), "redis://:"+secret+"@127.0.0.1:1?addr=127.0.0.1:2&prefix=p:")
	if err != nil {
		t.Fatal(err)
	}
	if o.Kind != storeurl.Redis || !strings.Contains(o.Desc, "xxxxx") || strings.Contains(o.Desc, secret) {
		t.Errorf("unexpected kind %s or description %q", o.Kind, o.Desc)
	}
	if err := o.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// A wrong password makes every operation fail; the error must not carry it.
func TestRedisErrorsAreRedacted(t *testing.T) {
	srv := testredis.Start(t, "--requirepass", "the-right-one")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	o, err := storeurl.Open(ctx, "redis://default:"+secret+"@"+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	_, err = o.Store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second})
	if err == nil {
		t.Fatal("expected an authentication error")
	}
	if msg := o.Redact(err).Error(); strings.Contains(msg, secret) {
		t.Errorf("error leaks the password: %s", msg)
	}
	if !errors.Is(o.Redact(err), err) {
		t.Errorf("Redact broke the error chain")
	}
}

// A Redis store opened from a URL honours its context's deadline on a dead
// connection (go-redis ContextTimeoutEnabled), instead of waiting out the
// client's 3 s ReadTimeout: the lease's renew timeout depends on it.
func TestRedisHonoursContextDeadlines(t *testing.T) {
	srv := testredis.Start(t)
	px, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	o, err := storeurl.Open(t.Context(), "redis://"+px.Addr()+"?max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Store.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := px.Blackhole(true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = o.Store.Renew(ctx, "k", "t", time.Minute)
	if err == nil {
		t.Fatal("expected the renewal through a black hole to fail")
	}
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Fatalf("expected the renewal to end near its 200ms deadline, it took %v", el)
	}
	_ = px.Blackhole(false)
}

// Identifiers in URLs are checked against a strict pattern, not quoted.
func TestIdentifiersValidated(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:1?prefix=a*b",
		"redis://127.0.0.1:1?prefix=a%0Ab",
		"etcd://127.0.0.1:1?prefix=a%20b",
		"postgres://u@127.0.0.1:1/db?table=t$fn$x",
		"postgres://u@127.0.0.1:1/db?schema=Public",
	} {
		if _, err := storeurl.Open(t.Context(), raw); !errors.Is(err, storeurl.ErrBadURL) {
			t.Errorf("%s: expected ErrBadURL, got %v", raw, err)
		}
	}
}
