package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/internal/testtls"
)

// expectConfigExit runs `run --on-store-error fail-open` and `ls` (with
// all, also the other commands that open a store) against url and expects
// each to exit want without running the child and without showing the
// password.
func expectConfigExit(t *testing.T, url string, want int, secret string, all bool) {
	t.Helper()
	marker := filepath.Join(t.TempDir(), "ran")
	commands := [][]string{
		{"run", "--key", "e2e:misconfig", "--on-store-error", "fail-open", "--", "sh", "-c", "touch " + marker},
		{"run", "--key", "e2e:misconfig", "--", "sh", "-c", "touch " + marker},
		{"ls"},
		{"inspect", "e2e:misconfig"},
		{"release", "e2e:misconfig", "--force"},
		{"permits", "e2e:misconfig"},
		{"leader", "e2e:misconfig"},
		{"elect", "--key", "e2e:misconfig", "--", "sh", "-c", "touch " + marker},
	}
	if !all {
		commands = [][]string{commands[0], commands[2]}
	}
	for _, args := range commands {
		code, stdout, stderr := lh(t, []string{"LEASEHOLD_STORE=" + url}, args...)
		if code != want {
			t.Errorf("%s: expected exit %d, got %d\nstderr: %s", args[0], want, code, stderr)
		}
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("%s: the output shows the password:\n%s%s", args[0], stdout, stderr)
		}
		noPanic(t, stdout, stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran on a misconfigured store")
	}
}

// A store that refuses the credentials exits 77, one whose TLS does not
// verify 78, in every command, and run never runs its command degraded.
func TestMisconfiguredStoreExits77Or78(t *testing.T) {
	ca, other := testtls.New(t), testtls.New(t)
	t.Run("redis wrong password", func(t *testing.T) {
		srv := testredis.Start(t, "--requirepass", "right-pass-123")
		expectConfigExit(t, fmt.Sprintf("redis://:wrong-pass-456@%s", srv.Addr), 77, "wrong-pass-456", true)
	})
	t.Run("redis TLS with another CA", func(t *testing.T) {
		srv := testredis.StartTLS(t, ca.ServerCert, ca.ServerKey)
		expectConfigExit(t, fmt.Sprintf("rediss://:some-pass-789@%s?ca_file=%s", srv.Addr, other.CA), 78, "some-pass-789", true)
	})
	t.Run("etcd auth", func(t *testing.T) {
		c := testetcd.Start(t)
		enableEtcdAuth(t, c.Endpoints())
		expectConfigExit(t, fmt.Sprintf("etcd://app:wrong-pass-456@%s", c.ClientAddr), 77, "wrong-pass-456", true)
		expectConfigExit(t, "etcd://"+c.ClientAddr, 77, "app-pass-1", false)
		expectConfigExit(t, fmt.Sprintf("etcd://app:app-pass-1@%s?prefix=mine/", c.ClientAddr), 77, "app-pass-1", false)
	})
	t.Run("etcd TLS with another CA", func(t *testing.T) {
		m := testetcd.StartTLS(t, ca.CA, ca.ServerCert, ca.ServerKey)
		expectConfigExit(t, fmt.Sprintf("etcds://%s?ca_file=%s&cert_file=%s&key_file=%s", m.Addr, other.CA, ca.ClientCert, ca.ClientKey), 78, "no-password", true)
		expectConfigExit(t, fmt.Sprintf("etcds://%s?ca_file=%s&cert_file=%s&key_file=%s", m.Addr, ca.CA, other.ClientCert, other.ClientKey), 78, "no-password", false)
		expectConfigExit(t, fmt.Sprintf("etcds://%s?ca_file=%s", m.Addr, ca.CA), 78, "no-password", false)
		expectConfigExit(t, "etcd://"+m.Addr, 78, "no-password", false)
	})
}

// enableEtcdAuth turns on etcd auth with a root user and a user "app"
// (password "app-pass-1") whose role covers only "other/".
func enableEtcdAuth(t *testing.T, endpoints []string) {
	t.Helper()
	root, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "root-pass-1"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "other"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "other", "other/", clientv3.GetPrefixRangeEnd("other/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "app", "app-pass-1"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "app", "other"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("etcd auth setup: %v", err)
		}
	}
}
