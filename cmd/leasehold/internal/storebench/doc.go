// Package storebench compares the stores in one benchmark run: the embedded
// memory store, Redis (a real redis-server) and etcd (an embedded
// single-member server), all on loopback in the same process run, so the
// numbers share one machine load. It has no non-test code; see
// storebench_test.go; its last figures are in `git log -p BENCHMARKS.md`
// (the section "Redis, etcd and memory in one run", removed in round 3).
//
//	go test -run '^$' -bench Stores -benchtime 2000x ./internal/storebench/
package storebench
