package doctor

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/testetcd"
	"github.com/leasehold/leasehold/internal/testtls"
)

// A plaintext etcd without authentication WARNs about both; with
// authentication on only TLS is left; over TLS (opened as the CLI opens
// etcds:// URLs) TLS is seen on. The single member is in sync and its
// version is covered.
func TestEtcdSecurity(t *testing.T) {
	m := testetcd.Start(t)
	cli := m.Client(t)
	ctx := t.Context()
	rs := Etcd(ctx, cli, Options{})
	r := wantStatus(t, rs, "etcd_security", Warn)
	if r.Seen != "TLS off, authentication off" || !strings.Contains(r.Fix, "etcdctl auth enable") || !strings.Contains(r.Fix, "etcds://") {
		t.Fatalf("expected both missing and both fixes, got %+v", r)
	}
	wantStatus(t, rs, "etcd_members", OK)
	wantStatus(t, rs, "etcd_version", OK)

	if _, err := cli.UserAdd(ctx, "root", "root-pass"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), Username: "root", Password: "root-pass",
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	r = wantStatus(t, Etcd(ctx, root, Options{}), "etcd_security", Warn)
	if !strings.HasPrefix(r.Seen, "TLS off, authentication on") || strings.Contains(r.Fix, "auth enable") {
		t.Fatalf("expected only TLS missing, got %+v", r)
	}

	f := testtls.New(t)
	tm := testetcd.StartTLS(t, f.CA, f.ServerCert, f.ServerKey)
	q := url.Values{"ca_file": {f.CA}, "cert_file": {f.ClientCert}, "key_file": {f.ClientKey}}
	o, err := storeurl.Open(ctx, "etcds://"+tm.Addr+"?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	r = wantStatus(t, Etcd(ctx, o.Client().(*clientv3.Client), Options{}), "etcd_security", Warn)
	if r.Seen != "TLS on, authentication off" {
		t.Fatalf("expected TLS on, got %+v", r)
	}
}

// The member and version verdicts over statuses as etcd reports them: a
// member that does not answer or lags by more than MaxRaftLag entries
// WARNs, and so does a member older than 3.4. (A single test member is in
// sync and current: TestEtcdSecurity covers the OK side on a real server.)
func TestEtcdMemberVerdicts(t *testing.T) {
	st := func(name, version string, index uint64) memberStatus {
		return memberStatus{name: name, resp: &clientv3.StatusResponse{Version: version, RaftIndex: index}}
	}
	for _, tc := range []struct {
		name             string
		sts              []memberStatus
		members, version Status
	}{
		{"in sync", []memberStatus{st("a", "3.5.9", 100), st("b", "3.5.9", 120), st("c", "3.5.9", 90)}, OK, OK},
		{"one far behind", []memberStatus{st("a", "3.5.9", 5000), st("b", "3.5.9", 5000), st("c", "3.5.9", 3000)}, Warn, OK},
		{"one down", []memberStatus{st("a", "3.4.23", 100), st("b", "3.4.23", 100), {name: "c", err: errors.New("context deadline exceeded")}}, Warn, OK},
		{"old member", []memberStatus{st("a", "3.3.27", 100), st("b", "3.5.9", 100)}, OK, Warn},
	} {
		if got := etcdMembers(tc.sts); got.Status != tc.members {
			t.Errorf("%s: expected etcd_members %s, got %+v", tc.name, tc.members, got)
		}
		if got := etcdVersion(tc.sts); got.Status != tc.version {
			t.Errorf("%s: expected etcd_version %s, got %+v", tc.name, tc.version, got)
		}
	}
}
