package drill

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/faultproxy"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// errRestartSkipped is returned by backend.restart when the drill cannot
// restart the store; its message says why.
var errRestartSkipped = errors.New("drill: restart skipped")

// inspectStore is a store that can also describe its locks and permits.
type inspectStore interface {
	driver.Store
	driver.Inspector
	driver.Semaphorer
}

// backend is the lock store a drill runs against and the faults it can
// inject into the path between the replicas and the store.
type backend interface {
	// open returns the connection of replica id's process to the store and
	// a function that closes it.
	open(id int) (driver.Store, func(), error)
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
	// moment the data is lost, before any grant on the emptied store can
	// return. errRestartSkipped says it could not.
	restart(mark func()) error
	// heal turns every fault off.
	heal()
	close()
}

// proxied is what the Redis, etcd and PostgreSQL backends share: the fault
// proxies between the replicas and the store (one per endpoint), or the
// partition fault's network, and the rules for calls that went through
// them.
type proxied struct {
	cfg     Config
	proxies []*faultproxy.Proxy
	part    *nsCluster // the partition fault's servers, else nil
	closers []func()   // what close undoes, in the order it was opened
}

// maybeApplied: a failed call that is not an answer from the store (a
// timeout, a cut connection) may have been applied.
func (p *proxied) maybeApplied(err error) bool {
	return !errors.Is(err, leasehold.ErrNotOwned) && !errors.Is(err, leasehold.ErrNotAcquired) &&
		!errors.Is(err, errProcessDead)
}

// lateness: a request the proxy was holding (latency) when the client gave
// up is still forwarded, so it may be applied up to the latency after the
// call returned; plus a little for the scheduler.
func (p *proxied) lateness() time.Duration {
	late := 25 * time.Millisecond
	if slices.Contains(p.cfg.Faults, FaultLatency) {
		late += p.cfg.Latency
	}
	if slices.Contains(p.cfg.Faults, FaultPartition) {
		// A request sent into the cut is retransmitted by TCP after the
		// heal (backing off, up to a few seconds) and applied then.
		late += p.cfg.partitionCut() + 3*time.Second
	}
	return late
}

func (p *proxied) each(f func(*faultproxy.Proxy) error) {
	for _, x := range p.proxies {
		_ = f(x)
	}
}

func (p *proxied) setDown(down bool) {
	p.each(func(x *faultproxy.Proxy) error { return x.SetDown(down) })
}

func (p *proxied) setLatency(d time.Duration) {
	p.each(func(x *faultproxy.Proxy) error { return x.SetLatency(d) })
}

func (p *proxied) dropReplies(rate float64) {
	p.each(func(x *faultproxy.Proxy) error { return x.DropReplies(rate) })
}

// heal turns every fault off, the partition too.
func (p *proxied) heal() {
	p.setDown(false)
	p.setLatency(0)
	p.dropReplies(0)
	if p.part != nil {
		for i := range p.part.net.Nodes {
			_ = p.part.net.Heal(i)
		}
	}
}

func (p *proxied) partitioned() bool { return p.part != nil }

// atClose has close call f before what was opened earlier.
func (p *proxied) atClose(f func()) { p.closers = append(p.closers, f) }

// close undoes what the backend opened, the latest first: it deletes the
// run's data (best effort; on Redis and PostgreSQL only from a store the
// drill did not start), then closes the clients, the proxies and the
// drill's own servers.
func (p *proxied) close() {
	for _, f := range slices.Backward(p.closers) {
		f()
	}
}

// startProxy starts a fault proxy in front of addr.
func (p *proxied) startProxy(addr string) (*faultproxy.Proxy, error) {
	x, err := faultproxy.Start(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	p.proxies = append(p.proxies, x)
	p.atClose(func() { _ = x.Close() })
	return x, nil
}

// processEnd is the end of a replica process: its connections close first
// (closeConn), as a dead process's do, so the store's Close (which releases
// what the Store still holds; on etcd, revokes the shared leases, which
// deletes every lock on them at once) cannot release what a crashed holder
// left behind: that must stay locked until it expires. A graceful end
// released every lock through the Locker before this runs.
func processEnd(closeConn func(), s io.Closer) func() {
	return func() {
		closeConn()
		_ = s.Close()
	}
}

// runID returns a random name for one run's keys.
func runID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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

func (m *memBackend) open(int) (driver.Store, func(), error) { return m.mem, func() {}, nil }
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
		case memstore.OpAcquire, memstore.OpRenew, memstore.OpRenewBatch, memstore.OpRelease,
			memstore.OpAcquirePermit, memstore.OpRenewPermit, memstore.OpReleasePermit:
			if m.float() < rate {
				return memstore.Fault{DropReply: true}
			}
		}
		return memstore.Fault{}
	})
}

// restart marks the loss before it happens: Restart wakes every waiter,
// and a grant on the emptied store can return before a mark taken after it,
// so an overlap the restart caused would look like one without a restart.
func (m *memBackend) restart(mark func()) error {
	mark()
	m.mem.Restart()
	return nil
}

func (m *memBackend) heal() {
	m.mem.SetDown(false)
	m.mem.SetLatency(0)
	m.mem.SetFaults(nil)
}
