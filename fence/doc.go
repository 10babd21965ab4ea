// Package fence makes storage reject writes from stale lease holders.
//
// A lease can end while its holder is paused (a GC pause, a stalled VM, a
// partition): the holder wakes up still believing it owns the key, and writes.
// Lease safety ends there; fencing is what makes that write harmless. Every
// acquisition of a key gets a fence token (leasehold.Lease.Fence) that is
// greater than every earlier one, and the storage being written checks it:
//
//	a write is applied when its fence >= the last accepted fence, and
//	rejected with ErrStaleFence when it is lower.
//
// The rule is order, not equality: "greater or equal" lets one lease write
// many times, and only the current holder has the current fence.
//
// Three resources ship behind the one-method Resource interface, which your
// own storage can implement too (Reporter and CheckFence help):
//
//   - Register (this package): an in-memory fenced register.
//   - pgfence.Table (package fence/pgfence, its own module so that only
//     PostgreSQL users build pgx): a PostgreSQL table with a fence column,
//     written with a conditional UPDATE or INSERT ... ON CONFLICT, inside the
//     caller's transaction if it wants (WithDB).
//   - redisfence.Redis (package fence/redisfence): a hash {value, fence}
//     written by a Lua script.
//
// This package itself imports neither pgx nor go-redis.
//
// Write(ctx, resource, lease, key, value) writes with a lease's fence; it
// refuses a degraded (fail-open) lease, which has no fence.
//
// Every rejection is reported to the resource's leasehold.Observer as an
// EventStaleWrite (leasehold_stale_writes_rejected_total).
//
// What fencing does not guarantee: it protects only writes that go through a
// fenced resource and carry the fence; side effects elsewhere (an e-mail, a
// call to another service) are not fenced. Fences from different keys are not
// comparable unless the lock store makes them so (memstore and redisstore
// derive them from a clock floor, which helps but is not a promise).
// Fence 0 is never a valid fence.
package fence
