package doctor

import (
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
