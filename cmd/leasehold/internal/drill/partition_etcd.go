package drill

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/leasehold/leasehold/cmd/leasehold/internal/etcdproc"
)

// etcdMembers is the size of the partition fault's etcd cluster.
const etcdMembers = 3

// startEtcdPartition starts the partition fault's etcd cluster and returns
// its client endpoints: one member per network namespace, talking to its
// peers over the namespaces' network and listening for clients on a unix
// socket. Replica i's client talks to member i % 3 alone, so it shares
// that member's side of a cut, as a process on the member's machine would;
// the observer talks to all three.
func startEtcdPartition(_ context.Context) (*nsCluster, []string, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --store %s: %v", ErrInvalidConfig, StoreEtcdServer, etcdproc.ErrNoBinary)
	}
	p, err := newNSCluster(etcdMembers, "lhpe-")
	if err != nil {
		return nil, nil, err
	}
	var initial, endpoints []string
	for i, nd := range p.net.Nodes {
		initial = append(initial, fmt.Sprintf("m%d=http://%s:2380", i, nd.IP))
	}
	for i, nd := range p.net.Nodes {
		peer := "http://" + nd.IP + ":2380"
		client := fmt.Sprintf("unix://m%d:2379", i) // a socket file in the directory
		if err := p.start(i, bin, "--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(p.dir, fmt.Sprintf("m%d.data", i)),
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "leasehold-drill", "--log-level", "error"); err != nil {
			p.close()
			return nil, nil, fmt.Errorf("%w: start etcd member %d: %v", ErrSetup, i, err)
		}
		endpoints = append(endpoints, "unix://"+filepath.Join(p.dir, fmt.Sprintf("m%d:2379", i)))
	}
	return p, endpoints, nil
}

// leader returns the member that reports itself leader, or -1.
func (b *etcdBackend) leader(ctx context.Context) int {
	for i, ep := range b.base.Endpoints {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		st, err := b.direct.Status(sctx, ep)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// cut partitions the member of replica id (and every replica on it) from
// the other members. A cut leader makes the majority elect a new one, which
// extends every lease: the checker is told, as after a restart.
func (b *etcdBackend) cut(id int) (string, error) {
	m := id % etcdMembers
	wasLeader := b.leader(b.ctx) == m
	role := "a follower"
	if wasLeader {
		role = "the leader"
	}
	var on []string
	for r := m; r < b.cfg.Replicas; r += etcdMembers {
		on = append(on, fmt.Sprint(r))
	}
	what := fmt.Sprintf("etcd member m%d (%s; replicas %s on it) cut off from the other members", m, role, strings.Join(on, ","))
	if err := b.part.net.Cut(m); err != nil {
		return what, err
	}
	if wasLeader {
		b.onRevive()
	}
	return what, nil
}

// waitLeader waits until a member reports itself leader.
func (b *etcdBackend) waitLeader(ctx context.Context) error {
	if !waitUntil(20*time.Second, func() bool { return b.leader(ctx) >= 0 }) {
		return fmt.Errorf("%w: the etcd cluster in the namespaces elected no leader in 20 s", ErrSetup)
	}
	return nil
}

func (b *etcdBackend) mend(id int) error { return b.part.net.Heal(id % etcdMembers) }
