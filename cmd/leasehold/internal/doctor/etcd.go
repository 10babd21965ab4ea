package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxRaftLag is the raft index spread between members above which the
// etcd member check WARNs.
const MaxRaftLag = 1000

// Etcd runs every etcd check through cli.
func Etcd(ctx context.Context, cli *clientv3.Client, o Options) []Result {
	members, err := cli.MemberList(ctx)
	if err != nil {
		return []Result{{Check: "etcd_members", Status: Fail, Seen: "MemberList: " + firstLine(err.Error()),
			Why: "no lock can be taken without a quorum", Fix: "check the endpoints and that a quorum of members runs"}}
	}
	var statuses []memberStatus
	for _, m := range members.Members {
		st := memberStatus{name: m.Name}
		if len(m.ClientURLs) == 0 {
			st.err = fmt.Errorf("no client URL (not started)")
		} else {
			st.url = m.ClientURLs[0]
			st.resp, st.err = cli.Status(ctx, st.url)
		}
		statuses = append(statuses, st)
	}
	return []Result{etcdSecurity(ctx, cli), etcdMembers(statuses), etcdVersion(statuses)}
}

type memberStatus struct {
	name, url string
	resp      *clientv3.StatusResponse
	err       error
}

// etcdSecurity WARNs about a cluster without authentication or without TLS
// on this client's endpoints.
func etcdSecurity(ctx context.Context, cli *clientv3.Client) Result {
	const check = "etcd_security"
	tls := true
	for _, ep := range cli.Endpoints() {
		if !strings.HasPrefix(ep, "https://") {
			tls = false
		}
	}
	auth, known := false, false
	if resp, err := cli.AuthStatus(ctx); err == nil {
		auth, known = resp.Enabled, true
	} else if cli.Username == "" {
		// etcd before 3.5 has no AuthStatus. A client without a user that
		// got this far (storeurl reads the prefix before) was not refused.
		auth, known = false, true
	}
	seen := fmt.Sprintf("TLS %s, authentication %s", onOff(tls), onOff(auth))
	if !known {
		seen = fmt.Sprintf("TLS %s, authentication on (user %s)", onOff(tls), cli.Username)
		auth = true
	}
	if tls && auth {
		return Result{Check: check, Status: OK, Seen: seen}
	}
	var fix []string
	if !auth {
		fix = append(fix, "etcdctl user add root && etcdctl role add leasehold && etcdctl role grant-permission leasehold --prefix=true readwrite leasehold/ && etcdctl user add leasehold && etcdctl user grant-role leasehold leasehold && etcdctl auth enable")
	}
	if !tls {
		fix = append(fix, "serve clients over TLS (--cert-file, --key-file, --client-cert-auth) and use etcds:// with ca_file=")
	}
	return Result{Check: check, Status: Warn, Seen: seen,
		Why: "anyone who reaches the client port can delete or overwrite a lock key or revoke its lease, and the holder learns it only at its next renewal",
		Fix: strings.Join(fix, "; then ")}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// etcdMembers WARNs about a member that does not answer or whose raft index
// is far behind the others'.
func etcdMembers(sts []memberStatus) Result {
	const check = "etcd_members"
	var lo, hi uint64
	var down []string
	first := true
	for _, s := range sts {
		if s.err != nil {
			down = append(down, s.name+" ("+firstLine(s.err.Error())+")")
			continue
		}
		if first || s.resp.RaftIndex < lo {
			lo = s.resp.RaftIndex
		}
		if first || s.resp.RaftIndex > hi {
			hi = s.resp.RaftIndex
		}
		first = false
	}
	seen := fmt.Sprintf("%d member(s), raft index spread %d", len(sts), hi-lo)
	if len(down) > 0 {
		return Result{Check: check, Status: Warn, Seen: seen + "; not answering: " + strings.Join(down, ", "),
			Why: "every member down brings the cluster closer to losing quorum, when no lock can be taken or renewed and every holder's lease runs out",
			Fix: "restart the member or replace it (etcdctl member remove, then member add)"}
	}
	if hi-lo > MaxRaftLag {
		return Result{Check: check, Status: Warn, Seen: seen,
			Why: "a member far behind cannot take over as leader soon, so one more failure stalls the cluster and every lease with it",
			Fix: "look at the slow member's disk (fsync latency: etcd_disk_wal_fsync_duration_seconds) and network, or replace it"}
	}
	return Result{Check: check, Status: OK, Seen: seen}
}

// etcdVersion WARNs about members older than 3.4, whose leases restart at
// their full TTL on every leader change (no lease checkpointing).
func etcdVersion(sts []memberStatus) Result {
	const check = "etcd_version"
	var versions, old []string
	for _, s := range sts {
		if s.err != nil {
			continue
		}
		v := s.resp.Version
		versions = append(versions, s.name+" "+v)
		major, rest, _ := strings.Cut(v, ".")
		minor, _, _ := strings.Cut(rest, ".")
		ma, err1 := strconv.Atoi(major)
		mi, err2 := strconv.Atoi(minor)
		if err1 != nil || err2 != nil || ma != 3 || mi < 4 {
			old = append(old, s.name+" "+v)
		}
	}
	if len(versions) == 0 {
		return Result{Check: check, Status: Skip, Seen: "no member answered Status", Fix: "see etcd_members"}
	}
	if len(old) > 0 {
		return Result{Check: check, Status: Warn, Seen: strings.Join(versions, ", "),
			Why: "leasehold is tested with etcd 3.4 and later; older servers restart every lease at its full TTL on a leader change, so a crashed holder's lock can outlive its TTL",
			Fix: "upgrade etcd to 3.4 or later, one member at a time"}
	}
	return Result{Check: check, Status: OK, Seen: strings.Join(versions, ", ")}
}
