package drill

import (
	"context"
	"sync"

	"github.com/leasehold/leasehold/fence"
)

// register is the storage the jobs write their results to: fence.Register
// (fencing on) or unfencedRegister (fencing off).
type register interface {
	Write(ctx context.Context, key string, fence uint64, value []byte) error
	Read(key string) (value []byte, fence uint64, ok bool)
}

var (
	_ register = (*fence.Register)(nil)
	_ register = (*unfencedRegister)(nil)
)

// unfencedRegister accepts every write: the register with fencing off. It
// remembers the last write's fence only so reads can report it.
type unfencedRegister struct {
	mu    sync.Mutex
	cells map[string]cell
}

type cell struct {
	value []byte
	fence uint64
}

func (u *unfencedRegister) Write(_ context.Context, key string, fence uint64, value []byte) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cells == nil {
		u.cells = make(map[string]cell)
	}
	u.cells[key] = cell{value: append([]byte(nil), value...), fence: fence}
	return nil
}

func (u *unfencedRegister) Read(key string) ([]byte, uint64, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	c, ok := u.cells[key]
	return append([]byte(nil), c.value...), c.fence, ok
}
