// Package fencetest checks a fenced resource of your own against the fence
// rule, the way `leasehold drill` checks the lock stores: concurrent lease
// holders write to it with their fences, some of them pausing past their
// lease's TTL before writing (a GC pause, a stalled VM), and the recorded
// history is checked twice:
//
//   - no stale write accepted: no accepted write carries a lower fence than
//     an accepted write to the same key that returned before it was called;
//   - linearizable as a fenced register (porcupine): every write with a
//     fence >= the stored one was applied, every lower one rejected, and every
//     read saw a state some ordering of the operations explains.
//
// Run drives a resource and checks it in one call; Recorder and Check check a
// history your own harness records. Model is the porcupine model, for
// histories recorded elsewhere.
//
// A resource that passes must apply a write when its fence is >= the last
// accepted fence for the key, and reject it with fence.ErrStaleFence when it
// is lower: an equality check, a strictly-greater check or no check at all
// each fail.
package fencetest
