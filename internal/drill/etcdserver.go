package drill

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Timing of the drill's own etcd member: a short heartbeat and election
// timeout so a restart elects the member again quickly; etcd's minimum lease
// TTL is then 1 s (1.5 × the election timeout, rounded up to seconds).
const (
	etcdTickMs     = 50
	etcdElectionMs = 500
	etcdReadyWait  = 20 * time.Second
)

// etcdServer is a single-member etcd the drill runs in its own process
// (go.etcd.io/etcd/server/v3/embed), on free loopback ports, in a temporary
// data directory. A restart stops the member and starts it again on the same
// ports and data directory: etcd keeps its keys and leases across it.
type etcdServer struct {
	dir                 string
	clientURL, peerURL  url.URL
	clientAddr          string
	mu                  sync.Mutex
	etcd                *embed.Etcd // nil while stopped
	initial, clusterTok string
}

// startEtcdServer starts the member and waits until it serves.
func startEtcdServer(ctx context.Context) (*etcdServer, error) {
	dir, err := os.MkdirTemp("", "leasehold-drill-etcd-")
	if err != nil {
		return nil, fmt.Errorf("%w: etcd data directory: %v", ErrSetup, err)
	}
	caddr, err1 := freeLoopbackAddr()
	paddr, err2 := freeLoopbackAddr()
	if err1 != nil || err2 != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: free ports for etcd: %v", ErrSetup, firstErr(err1, err2))
	}
	s := &etcdServer{
		dir:        filepath.Join(dir, "member"),
		clientURL:  url.URL{Scheme: "http", Host: caddr},
		peerURL:    url.URL{Scheme: "http", Host: paddr},
		clientAddr: caddr,
		clusterTok: "leasehold-drill",
	}
	s.initial = "drill=" + s.peerURL.String()
	if err := s.start(ctx, embed.ClusterStateFlagNew); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (s *etcdServer) start(ctx context.Context, state string) error {
	cfg := embed.NewConfig()
	cfg.Name = "drill"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	cfg.InitialCluster = s.initial
	cfg.InitialClusterToken = s.clusterTok
	cfg.ClusterState = state
	cfg.TickMs = etcdTickMs
	cfg.ElectionMs = etcdElectionMs
	cfg.UnsafeNoFsync = true // the process survives a restart: the page cache keeps the data
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("%w: start etcd: %v", ErrSetup, err)
	}
	t := time.NewTimer(etcdReadyWait)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("%w: etcd on %s: %v", ErrSetup, s.clientAddr, err)
	case <-t.C:
		e.Close()
		return fmt.Errorf("%w: etcd on %s not ready after %v", ErrSetup, s.clientAddr, etcdReadyWait)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("%w: etcd on %s: %v", ErrSetup, s.clientAddr, ctx.Err())
	}
	s.mu.Lock()
	s.etcd = e
	s.mu.Unlock()
	return nil
}

// kill stops the member abruptly (the raft node first, like a crash), then
// closes its listeners.
func (s *etcdServer) kill() {
	s.mu.Lock()
	e := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	if e == nil {
		return
	}
	e.Server.HardStop()
	e.Close()
}

// restart kills the member and starts it again on the same ports and data
// directory; it keeps every key and lease (etcd extends every lease by the
// election timeout when the member becomes leader again).
func (s *etcdServer) restart(ctx context.Context) error {
	s.kill()
	return s.start(ctx, embed.ClusterStateFlagExisting)
}

// stop stops the member and removes its data directory.
func (s *etcdServer) stop() {
	s.kill()
	_ = os.RemoveAll(filepath.Dir(s.dir))
}
