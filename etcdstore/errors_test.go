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
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// List skips a lock it cannot decode and reports it with ErrBadEntry, with
// the good locks; Inspect of that key reports ErrBadEntry.
func TestListSkipsBadEntries(t *testing.T) {
	_, cli, s, ctx := startStore(t, 10*time.Second)
	base := uniqueKey(t, "")
	for _, k := range []string{"a", "c"} {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: base + k, Token: "t" + k, TTL: time.Minute, Holder: "h"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "lh-test/"+base+"b", "\x00garbage"); err != nil { // no token
		t.Fatal(err)
	}
	ls, err := s.List(ctx, base)
	if !errors.Is(err, leasehold.ErrBadEntry) || !strings.Contains(err.Error(), base+"b") {
		t.Fatalf("List: expected ErrBadEntry naming the bad key, got %v", err)
	}
	if len(ls) != 2 || ls[0].Key != base+"a" || ls[1].Key != base+"c" || ls[0].Holder != "h" {
		t.Fatalf("List: expected the good locks a and c with their holder, got %+v", ls)
	}
	if _, err := s.Inspect(ctx, base+"b"); !errors.Is(err, leasehold.ErrBadEntry) {
		t.Fatalf("Inspect of the bad entry: expected ErrBadEntry, got %v", err)
	}
}

// A user whose role does not cover the prefix gets ErrMisconfigured, a
// store failure that is not an outage, and never contention.
func TestPermissionDeniedIsMisconfigured(t *testing.T) {
	c := testetcd.Start(t)
	enableAuth(t, c)
	ctx := ctxFor(t, 20*time.Second)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Username: "app", Password: "apppw", Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: "lh-test/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second})
	if !errors.Is(err, leasehold.ErrMisconfigured) || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("Acquire outside the user's prefix: expected ErrMisconfigured, got %v", err)
	}
	if strings.Contains(err.Error(), "apppw") {
		t.Fatalf("the password leaked into the error: %v", err)
	}
}

// enableAuth turns on auth in c with a user root (password rootpw) and a
// user app (password apppw) whose role covers only the prefix other/; auth
// is turned off again in t.Cleanup.
func enableAuth(t *testing.T, c *testetcd.Cluster) {
	t.Helper()
	root := c.Client(t)
	ctx := ctxFor(t, 20*time.Second)
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "other"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "other", "other/", clientv3.GetPrefixRangeEnd("other/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "app", "apppw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "app", "other"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("auth setup: %v", err)
		}
	}
	t.Cleanup(func() {
		if rc, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Username: "root", Password: "rootpw", Logger: zap.NewNop()}); err == nil {
			_, _ = rc.AuthDisable(ctxFor(t, 5*time.Second))
			_ = rc.Close()
		}
	})
}
