// Package etcdstore is a driver.Store on etcd v3: every lock change is a
// raft transaction, fences are etcd revisions, and etcd's own lease expiry
// deletes what its owner stops renewing.
//
// Open a store by URL, as `leasehold --store` takes it:
//
//	st, err := etcdstore.OpenURL(ctx, "etcd://user:password@host:2379,host:2379?prefix=myapp/", etcdstore.Options{})
//
// or from Go, by endpoints (Open) or over a client you keep (New):
//
//	st, err := etcdstore.Open(ctx, []string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"}, etcdstore.Options{})
//	st, err := etcdstore.New(client, etcdstore.Options{Prefix: "myapp/"})
//	defer st.Close()
//	locker, err := leasehold.New(st, leasehold.Options{TTL: 15 * time.Second})
//
// Guaranteed:
//   - A lock, permit or queue entry whose owner stops renewing it is deleted
//     by etcd between its TTL and its TTL rounded up to whole seconds plus
//     1.5 s after its last write (a leader election restarts the count),
//     whatever this process remembers; the head of the queue takes a crashed
//     holder's lock over at its TTL. Close revokes the store's leases.
//   - An acknowledged lock survives the loss of any minority of members.
//   - Fences never go backward; a retry after a lost reply gets the same one.
//   - Waiters are served in arrival order; a release hands the key to the head.
//   - A request without an answer within Options.RequestTimeout fails with
//     ErrUnavailable (a store failure, never contention).
//
// Not guaranteed:
//   - TTLs below a second: etcd counts whole seconds (rounded up, at least 2 s
//     with etcd's default election timeout).
//   - Fences after a restore from an old snapshot or empty data directories,
//     unless restored with `etcdutl snapshot restore --bump-revision N
//     --mark-compacted`.
//   - A takeover at the right time when the holder's and the waiters' clocks
//     run at rates further apart than the holder's drift margin.
//
// A Store is safe for concurrent use; it runs one goroutine per watched key
// until Close. docs/etcd.md describes the key layout, the transactions, the
// expiry design, failures and the runbook.
package etcdstore
