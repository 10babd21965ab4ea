// Package etcdstore is a leasehold.Store on etcd v3, for locks that must stay
// correct through failures: every lock is a key written by a consensus
// (raft) transaction and attached to an etcd lease that expires it.
//
// Layout: the lock on key K is the etcd key Options.Prefix+K (default
// "leasehold/K"); its value is the owner token; it is attached to an etcd
// lease granted for this one acquisition. `etcdctl get leasehold/K -w json`
// shows the token, the create revision (the fence) and the lease ID, and
// `etcdctl lease timetolive ID` the time left.
//
// How each operation works:
//
//   - Acquire grants a lease with the TTL, then commits one transaction:
//     if the key does not exist, put it with the lease; else, if it holds our
//     token (a retry after a lost reply), move it to the new lease (same
//     fence); else read it. Two round trips (LeaseGrant + Txn): etcd cannot
//     grant a lease inside a transaction. A lost race revokes the unused lease
//     in the background and costs one more round trip (LeaseTimeToLive) to
//     report the holder's remaining TTL.
//   - The fence is the key's create revision: the cluster-wide revision of the
//     transaction that created the key. Revisions only grow, so every
//     acquisition of a key gets a fence greater than all earlier ones, and a
//     retry with the same token reports the same fence.
//   - Renew reads the key (a linearizable read), checks the token and sends
//     one lease keep-alive: two round trips. The keep-alive goes to the leader
//     and is not a raft write. When the lease was granted shorter than the
//     requested TTL, Renew moves the key to a new lease in a token-checked
//     transaction.
//   - Release deletes the key in a transaction that compares the value with
//     the token: one round trip. The lease is revoked in the background.
//   - Waiters watch the key for delete events (release and expiry both
//     delete it), see WaitRelease.
//
// TTLs are whole seconds: etcd leases have a granularity of one second, so a
// TTL is rounded up (1500 ms becomes 2 s), and etcd raises TTLs below its
// minimum (1.5 × election timeout, rounded up; 2 s with default settings).
// The server-side expiry is therefore never earlier than the TTL the holder
// uses for its own expiry guard, only later. The leader checks for expired
// leases every 500 ms, and a newly elected leader extends every lease by its
// full TTL: takeover after a crashed holder can take up to TTL rounded up +
// 0.5 s, or longer around an election.
//
// Not guaranteed: fences keep growing only while the cluster keeps its
// revision history. Restoring an old snapshot, or rebuilding the cluster from
// empty data directories, starts revisions lower; restore with
// `etcdutl snapshot restore --bump-revision N --mark-compacted` to keep them
// growing.
//
// A Store is safe for concurrent use. It runs one background goroutine that
// revokes unused leases; Close stops it.
package etcdstore
