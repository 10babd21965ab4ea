package drill

import (
	"errors"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// errRestartSkipped is returned by backend.restart when the drill cannot
// restart the store; its message says why.
var errRestartSkipped = errors.New("drill: restart skipped")

// inspectStore is a store that can also describe its locks and permits.
type inspectStore interface {
	leasehold.Store
	leasehold.Inspector
	leasehold.Semaphorer
}

// backend is the lock store a drill runs against and the faults it can
// inject into the path between the replicas and the store.
type backend interface {
	// open returns one replica process's connection to the store and a
	// function that closes it.
	open() (leasehold.Store, func(), error)
	// observer is a view of the store that no fault reaches: the checker's
	// source of truth for who holds a key.
	observer() inspectStore
	// observeTimeout bounds one observer call.
	observeTimeout() time.Duration
	// maybeApplied reports whether a failed acquire or renew may have been
	// applied by the store all the same (a lost reply).
	maybeApplied(err error) bool
	// lateness bounds how long after its return a failed call may still be
	// applied by the store (a request held on the way).
	lateness() time.Duration
	// expiryBound is how long after its last applied acquire or renew the
	// store may still hold a lock: the TTL, or more on a store whose expiry
	// is coarser (etcd).
	expiryBound() time.Duration
	setDown(bool)
	setLatency(time.Duration)
	// dropReplies loses the replies of applied calls with probability rate;
	// 0 turns it off.
	dropReplies(rate float64)
	// restart restarts the store so it loses its data; mark is called at the
	// moment the data is lost. errRestartSkipped says it could not.
	restart(mark func()) error
	// heal turns every fault off.
	heal()
	close()
}

// memBackend is the embedded memory store; its faults are memstore's own.
type memBackend struct {
	mem   *memstore.Store
	float func() float64
	ttl   time.Duration
}

func newMemBackend(float func() float64, ttl time.Duration) *memBackend {
	return &memBackend{mem: memstore.New(), float: float, ttl: ttl}
}

func (m *memBackend) open() (leasehold.Store, func(), error) { return m.mem, func() {}, nil }
func (m *memBackend) observer() inspectStore                 { return m.mem }
func (m *memBackend) observeTimeout() time.Duration          { return 20 * time.Millisecond }
func (m *memBackend) maybeApplied(err error) bool            { return errors.Is(err, memstore.ErrReplyLost) }
func (m *memBackend) lateness() time.Duration                { return 0 }
func (m *memBackend) expiryBound() time.Duration             { return m.ttl }
func (m *memBackend) setDown(down bool)                      { m.mem.SetDown(down) }
func (m *memBackend) setLatency(d time.Duration)             { m.mem.SetLatency(d) }
func (m *memBackend) close()                                 {}

func (m *memBackend) dropReplies(rate float64) {
	if rate == 0 {
		m.mem.SetFaults(nil)
		return
	}
	m.mem.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		switch op {
		case memstore.OpAcquire, memstore.OpRenew, memstore.OpRelease:
			if m.float() < rate {
				return memstore.Fault{DropReply: true}
			}
		}
		return memstore.Fault{}
	})
}

func (m *memBackend) restart(mark func()) error {
	m.mem.Restart()
	mark()
	return nil
}

func (m *memBackend) heal() {
	m.mem.SetDown(false)
	m.mem.SetLatency(0)
	m.mem.SetFaults(nil)
}
