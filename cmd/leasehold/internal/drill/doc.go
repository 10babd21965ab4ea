// Package drill runs a game day against leasehold, on the embedded memory
// store, or on Redis or etcd through a fault proxy (Config.Store): replicas of a small worker
// process jobs under per-item leases and write each job's result to a fenced
// register, while an injector pauses a holder past its TTL, takes the store
// down, crashes a holder without release, adds latency above the renew
// timeout, drops replies the store already applied and restarts the store (so
// that it loses its data; etcd keeps its data across the restart). Every register operation, lease and fault is
// recorded; a checker then decides from that history alone whether the
// invariants held: no stale write accepted, a linearizable register history
// (checked with porcupine), no duplicate executions, no lock stuck past its
// TTL, no client believing it holds a lock it does not, fences that never go
// backward, and every job done. It measures takeover time against the TTL.
//
// Config.Workload swaps the jobs for a leader election (leasehold.Election:
// at most one trusted leader at any moment, its fenced writes linearizable)
// or a semaphore (at most Config.Permits trusted holders, fences unique and
// increasing, crashed permits back after their TTL) on one key.
//
// With Config.Processes the replicas are child processes of the same binary
// (the hidden `drill worker` subcommand) on Redis: a pause is then SIGSTOP and
// SIGCONT, a crash SIGKILL, and the workers report their history to the
// drill as JSON lines over their stdout.
//
// Run is the library entry point; Command wires it to a `leasehold drill`
// cobra command. docs/drill.md describes the workload, the faults and how
// to read the report.
package drill
