package fence

import (
	"context"
	"sync"

	"github.com/leasehold/leasehold"
)

// Register is an in-memory fenced register: a map from key to (value, fence)
// that applies a write only when its fence is not older than the stored one.
// It is what `leasehold drill` writes to, and a reference implementation of
// Resource.
//
// A Register is safe for concurrent use. Its zero value is an empty register
// that reports to no observer; use NewRegister for options.
type Register struct {
	rep     Reporter
	onWrite func(Record)

	mu       sync.Mutex
	cells    map[string]cell
	seq      uint64
	accepted uint64
	rejected uint64
}

type cell struct {
	value []byte
	fence uint64
}

// Record is one write decided by a Register, as passed to
// RegisterOptions.OnWrite.
type Record struct {
	Seq      uint64 // 1, 2, 3, ...: the order in which the register decided writes
	Key      string
	Fence    uint64 // the write's fence
	Value    []byte // the write's value (a copy the callee may keep)
	Accepted bool   // applied (true) or rejected as stale (false)
	Prev     uint64 // the fence the key held before the write; 0 when it was empty
}

// RegisterOptions configure a Register. The zero value is valid.
type RegisterOptions struct {
	// Name is the locker name carried by events (Event.Locker), the metrics
	// label. Default "default".
	Name string
	// Resource names the register in events and errors (Event.Op). Default
	// "memory".
	Resource string
	// Observer receives an EventStaleWrite for every rejected write. Default:
	// none.
	Observer leasehold.Observer
	// OnWrite, when set, is called for every write with fence > 0, accepted or
	// rejected, in the order the register decided them, while the register's
	// lock is held: it sees a total order of writes and must not call the
	// Register. Default: none.
	OnWrite func(Record)
}

var _ Resource = (*Register)(nil)

// NewRegister returns an empty register.
func NewRegister(opts RegisterOptions) *Register {
	return &Register{
		rep:     Reporter{Name: opts.Name, Resource: orDefault(opts.Resource, "memory"), Observer: opts.Observer},
		onWrite: opts.OnWrite,
	}
}

// Write stores value under key with fence when fence >= the key's fence, and
// otherwise returns a *StaleError (matching ErrStaleFence) and changes
// nothing. Fence 0 is refused with ErrNoFence. value is copied. Write returns
// ctx's error, without writing, when ctx has already ended.
func (r *Register) Write(ctx context.Context, key string, fence uint64, value []byte) error {
	if err := CheckFence(fence); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	v := clone(value)
	r.mu.Lock()
	if r.cells == nil {
		r.cells = make(map[string]cell)
	}
	prev := r.cells[key].fence
	ok := fence >= prev
	if ok {
		r.cells[key] = cell{value: v, fence: fence}
		r.accepted++
	} else {
		r.rejected++
	}
	r.seq++
	if r.onWrite != nil {
		r.onWrite(Record{Seq: r.seq, Key: key, Fence: fence, Value: clone(v), Accepted: ok, Prev: prev})
	}
	r.mu.Unlock()
	if !ok {
		rep := r.rep
		if rep.Resource == "" { // zero Register
			rep.Resource = "memory"
		}
		return rep.Stale(key, fence, prev)
	}
	return nil
}

// Read returns a copy of key's value and its fence; ok is false when key was
// never written.
func (r *Register) Read(key string) (value []byte, fence uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.cells[key]
	return clone(c.value), c.fence, ok
}

// Stats returns how many writes were accepted and rejected as stale so far.
func (r *Register) Stats() (accepted, rejected uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.rejected
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
