package fencetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is one operation on a fenced resource as a client saw it: when it was
// called, when it returned, and what it returned. Call and Return are offsets
// from a common start (Recorder uses the time it was created).
type Op struct {
	Client   int    // the writer, from 0
	Key      string // the key written or read
	Write    bool   // a write; otherwise a read
	Fence    uint64 // write: the fence sent; read: the fence returned
	Value    string // write: the value sent; read: the value returned
	Found    bool   // read: the key had a value
	Accepted bool   // write: the resource applied it
	// Err is why a write failed other than as stale (ErrNoFence, a store
	// error): it was not applied and is not counted as a rejection.
	Err    string
	Call   time.Duration
	Return time.Duration
}

// StaleWrite is an accepted write whose fence is lower than the fence of an
// accepted write to the same key that returned before it was called: the
// write of a holder whose lease had ended landed over its successor's.
type StaleWrite struct {
	Write Op // the stale write
	After Op // the earlier accepted write with the higher fence
}

// String describes the stale write.
func (s StaleWrite) String() string {
	return fmt.Sprintf("key %q: write with fence %d (client %d) accepted at %v after fence %d (client %d) was accepted at %v",
		s.Write.Key, s.Write.Fence, s.Write.Client, s.Write.Call, s.After.Fence, s.After.Client, s.After.Return)
}

// StaleWrites returns every stale write in ops, at most one per write.
func StaleWrites(ops []Op) []StaleWrite {
	var out []StaleWrite
	byKey := map[string][]Op{}
	for _, o := range ops {
		if o.Write && o.Accepted {
			byKey[o.Key] = append(byKey[o.Key], o)
		}
	}
	for _, k := range sortedKeys(byKey) {
		acc := byKey[k]
		for _, w := range acc {
			for _, p := range acc {
				if p.Return < w.Call && w.Fence < p.Fence {
					out = append(out, StaleWrite{Write: w, After: p})
					break
				}
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// input and output are a register operation for porcupine.
type input struct {
	write bool
	fence uint64
	value string
}

type output struct {
	accepted bool
	refused  bool // failed other than as stale (Op.Err): changed nothing
	found    bool
	fence    uint64
	value    string
}

type state struct {
	set   bool
	fence uint64
	value string
}

// Model is the porcupine model of a register, partitioned by key (Op.Key in
// the operations' Metadata). Fenced, it is the rule of package fence: a write
// is applied when its fence is > 0 and >= the stored fence, and rejected
// otherwise without a change. Unfenced, every write is applied. A write that
// failed other than as stale (Op.Err) changes nothing. A read returns the
// stored value and fence.
func Model(fenced bool) porcupine.Model {
	return porcupine.Model{
		Partition: partitionByKey,
		Init:      func() any { return state{} },
		Step: func(st, in, out any) (bool, any) {
			s, i, o := st.(state), in.(input), out.(output)
			switch {
			case !i.write:
				return o.found == s.set && o.fence == s.fence && o.value == s.value, s
			case o.refused:
				return true, s
			}
			ok := !fenced || (i.fence > 0 && i.fence >= s.fence)
			if o.accepted != ok {
				return false, s
			}
			if ok {
				s = state{set: true, fence: i.fence, value: i.value}
			}
			return true, s
		},
		Equal: func(a, b any) bool { return a.(state) == b.(state) },
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			if i.write {
				return fmt.Sprintf("write(%d, %q) -> %v", i.fence, i.value, o.accepted)
			}
			return fmt.Sprintf("read() -> %q@%d", o.value, o.fence)
		},
	}
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	m := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Metadata.(string)
		m[k] = append(m[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

// Operations converts ops to porcupine operations for Model.
func Operations(ops []Op) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		p := porcupine.Operation{ClientId: o.Client, Call: int64(o.Call), Return: int64(o.Return), Metadata: o.Key}
		if o.Write {
			p.Input = input{write: true, fence: o.Fence, value: o.Value}
			p.Output = output{accepted: o.Accepted, refused: o.Err != ""}
		} else {
			p.Output = output{found: o.Found, fence: o.Fence, value: o.Value}
			p.Input = input{}
		}
		out = append(out, p)
	}
	return out
}

// Linearizable checks ops against Model(fenced) with porcupine. It returns
// porcupine.Unknown when timeout (> 0) passes before porcupine decides.
func Linearizable(ops []Op, fenced bool, timeout time.Duration) porcupine.CheckResult {
	return porcupine.CheckOperationsTimeout(Model(fenced), Operations(ops), timeout)
}

// ErrCheckFailed is matched by the error of Result.Err when a history breaks
// the fence rule.
var ErrCheckFailed = errors.New("fencetest: history breaks the fence rule")

// Result is what Check found in a history.
type Result struct {
	Ops      []Op
	Accepted int // writes applied
	Rejected int // writes rejected as stale
	Refused  int // writes that failed otherwise (Op.Err)
	// Stale lists the accepted stale writes; a correct resource has none.
	Stale []StaleWrite
	// Linearizable is porcupine's verdict on the history as a fenced
	// register: porcupine.Ok for a correct resource.
	Linearizable porcupine.CheckResult
}

// Err returns nil when the history is a correct fenced register, and
// otherwise an error matching ErrCheckFailed that says what broke. A history
// porcupine could not decide in time is not an error.
func (r Result) Err() error {
	var why []string
	if len(r.Stale) > 0 {
		why = append(why, fmt.Sprintf("%d stale writes accepted (first: %s)", len(r.Stale), r.Stale[0]))
	}
	if r.Linearizable == porcupine.Illegal {
		why = append(why, "the history is not linearizable as a fenced register (accept fence >= last, reject lower)")
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrCheckFailed, strings.Join(why, "; "))
}

// Check checks a history of a fenced resource: no stale write accepted, and
// the whole history linearizable as a fenced register (porcupine, giving up
// after timeout when > 0).
func Check(ops []Op, timeout time.Duration) Result {
	r := Result{Ops: ops, Stale: StaleWrites(ops), Linearizable: Linearizable(ops, true, timeout)}
	for _, o := range ops {
		switch {
		case !o.Write:
		case o.Accepted:
			r.Accepted++
		case o.Err != "":
			r.Refused++
		default:
			r.Rejected++
		}
	}
	return r
}
