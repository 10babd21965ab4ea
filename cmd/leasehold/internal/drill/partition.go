package drill

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/netns"
	"github.com/leasehold/leasehold/internal/redisproc"
)

// nsCluster is the partition fault's servers (netns.Net): processes on
// the nodes of a network of namespaces, with their files (unix sockets,
// data) in a directory of their own. The observer reaches them over unix
// sockets, which no cut reaches.
type nsCluster struct {
	net   *netns.Net
	dir   string
	procs []*exec.Cmd
}

// newNSCluster builds a network of n nodes and the directory (prefix).
func newNSCluster(n int, prefix string) (*nsCluster, error) {
	nt, err := netns.New(n)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	p := &nsCluster{net: nt}
	// A short directory: unix socket paths are limited to 107 bytes.
	if p.dir, err = os.MkdirTemp("/tmp", prefix); err != nil {
		p.close()
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	return p, nil
}

// start starts bin with args on node i, in the cluster's directory.
func (p *nsCluster) start(i int, bin string, args ...string) error {
	cmd := p.net.Nodes[i].Command(bin, args...)
	cmd.Dir = p.dir
	if err := cmd.Start(); err != nil {
		return err
	}
	p.procs = append(p.procs, cmd)
	return nil
}

// close kills the servers and removes the network and the directory.
func (p *nsCluster) close() {
	for _, c := range p.procs {
		_ = c.Process.Signal(syscall.SIGKILL)
		_ = c.Wait()
	}
	p.net.Close()
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}

// waitUntil calls ok every 50 ms until it returns true (then true) or
// within has passed (then false).
func waitUntil(within time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(within); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// partitionCut is how long the partition fault cuts a holder off: longer
// than the TTL, so that its lease expires on the server meanwhile.
func (c Config) partitionCut() time.Duration { return 3 * c.TTL }

// checkPartition checks what FaultPartition needs: the drill's own
// redis-server, no fault that goes through the fault proxy, no worker
// processes, and network namespaces (root and `ip`).
func (c Config) checkPartition() error {
	if !slices.Contains(c.Faults, FaultPartition) {
		return nil
	}
	for _, f := range c.Faults {
		if f != FaultPartition && f != FaultPause && f != FaultCrash {
			return fmt.Errorf("%w: --faults partition runs with pause and crash only (the store sits in a network namespace, without the fault proxy): drop %s", ErrInvalidConfig, f)
		}
	}
	switch {
	case c.kind() != storeOwnRedis && c.kind() != storeOwnEtcd:
		return fmt.Errorf("%w: the partition fault needs the drill's own servers in network namespaces: use --store %s or --store %s", ErrInvalidConfig, StoreRedisServer, StoreEtcdServer)
	case c.Processes:
		return fmt.Errorf("%w: --faults partition runs the replicas in-process: drop --processes", ErrInvalidConfig)
	}
	if err := netns.Available(); err != nil {
		return fmt.Errorf("%w: --faults partition: %v", ErrInvalidConfig, err)
	}
	return nil
}

// openPartition builds the network, starts redis-server on node 0 (node
// i+1 is replica i's machine, whose client dials from that namespace) and
// the observer's client on its unix socket.
func (b *redisBackend) openPartition(ctx context.Context, cfg Config) error {
	name := cmp.Or(cfg.RedisServer, "redis-server")
	bin, err := exec.LookPath(name)
	if err != nil {
		return setupError(fmt.Errorf("%w: %q: %v", redisproc.ErrNoBinary, name, err))
	}
	if b.part, err = newNSCluster(cfg.Replicas+1, "lhpart-"); err != nil {
		return err
	}
	b.atClose(b.part.close)
	ip, dir := b.part.net.Nodes[0].IP, b.part.dir
	sock := filepath.Join(dir, "redis.sock")
	if err := b.part.start(0, bin, "--port", "6379", "--bind", ip, "--unixsocket", sock,
		"--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--dir", dir, "--loglevel", "warning"); err != nil {
		return fmt.Errorf("%w: start redis-server in a namespace: %v", ErrSetup, err)
	}
	b.setDirect(redis.NewClient(&redis.Options{Network: "unix", Addr: sock, Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true,
		MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}))
	if !waitUntil(10*time.Second, func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err = b.direct.Ping(pctx).Err()
		return err == nil
	}) {
		return fmt.Errorf("%w: redis-server in the namespace did not answer: %v", ErrSetup, err)
	}
	addr := ip + ":6379" // the server's host:port inside the network
	base, err := baseOptions("redis://" + addr)
	if err != nil {
		return err
	}
	b.opts = replicaOptions(base, addr, cfg)
	return b.openObserver(ctx, "redis-server in the namespace")
}

// cut and mend partition replica id's node from the server; cut says what
// it cut.
func (b *redisBackend) cut(id int) (string, error) {
	return fmt.Sprintf("replica %d cut off from the store", id), b.part.net.Cut(id + 1)
}

func (b *redisBackend) mend(id int) error { return b.part.net.Heal(id + 1) }

// redeliverUntil hands ev's job to another replica again every TTL while
// nobody has taken it over (a waiter gives up on a store error, as during an
// etcd election), until the deadline, or (stopWhenTaken) until someone has.
func (d *drill) redeliverUntil(ctx context.Context, ev pauseEvent, deadline time.Time, stopWhenTaken bool) {
	var last time.Time // the first hint goes out at once
	for time.Now().Before(deadline) && sleep(ctx, 2*time.Millisecond) {
		taken := d.takenOver(ev)
		if taken && stopWhenTaken {
			return
		}
		if !taken && time.Since(last) >= d.cfg.TTL {
			d.redeliver(ev.job, ev.replica)
			last = time.Now()
		}
	}
}

// partitionState is the replica the partition fault has cut off: its
// worker holds its next write until after the heal, as a job that outlasts
// the partition would (its lease's renewals meanwhile go into the cut).
type partitionState struct {
	mu     sync.Mutex
	id     int
	healed chan struct{} // nil when no replica is cut off
	// From the cut until the note is written: the Locker name of the cut
	// replica, and when (and how) its first lease after the cut ended.
	locker   string
	leaseEnd time.Duration
	endHow   string
}

func (p *partitionState) set(id int) {
	p.mu.Lock()
	p.id, p.healed = id, make(chan struct{})
	p.locker, p.leaseEnd, p.endHow = fmt.Sprintf("replica-%d", id), 0, ""
	p.mu.Unlock()
}

// observe notes the end of the cut replica's lease.
func (p *partitionState) observe(e leasehold.Event, now func() time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.locker == "" || e.Locker != p.locker || p.leaseEnd != 0 {
		return
	}
	switch e.Kind {
	case leasehold.EventAbandoned, leasehold.EventLost, leasehold.EventExpired:
		p.endHow = e.Kind.String()
	case leasehold.EventHeld:
		p.leaseEnd = now()
	}
}

// ended stops watching and returns when the cut replica's lease ended (0:
// not yet) and how.
func (p *partitionState) ended() (time.Duration, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.locker = ""
	return p.leaseEnd, p.endHow
}

func (p *partitionState) clear() {
	p.mu.Lock()
	if p.healed != nil {
		close(p.healed)
		p.healed = nil
	}
	p.mu.Unlock()
}

// wait returns when replica id is not cut off, or ctx ends.
func (p *partitionState) wait(ctx context.Context, id int) {
	p.mu.Lock()
	healed := p.healed
	if p.id != id {
		healed = nil
	}
	p.mu.Unlock()
	if healed == nil {
		return
	}
	select {
	case <-healed:
	case <-ctx.Done():
	}
}

// partitioner is a backend that can cut a replica's node off the store.
type partitioner interface {
	partitioned() bool
	cut(id int) (string, error)
	mend(id int) error
}

// injectPartition cuts the node of a replica working under a lease off the
// store (its packets dropped both ways, its connections hanging) for
// Config.partitionCut, then heals it. The note says how long the cut holder
// kept trusting its lease, when another replica was granted the key and how
// many stale writes the register rejected meanwhile.
func (d *drill) injectPartition(ctx context.Context) string {
	p, ok := d.be.(partitioner)
	if !ok || !p.partitioned() {
		return "skipped: the store is not on a partition network (use --store " + StoreRedisServer + ")"
	}
	r, job := d.victim(ctx, -1)
	if r == nil {
		return "skipped: no replica was working"
	}
	cut := d.rec.since()
	d.cutOff.set(r.id)
	defer d.cutOff.clear() // after the heal
	what, err := p.cut(r.id)
	if err != nil {
		return fmt.Sprintf("partition failed: %v", err)
	}
	// The job's queue redelivers it, as it would a silent consumer's: the
	// next replica waits for the key while the cut one may still trust it.
	ev := pauseEvent{replica: r.id, job: job, at: cut}
	d.redeliverUntil(ctx, ev, time.Now().Add(d.cfg.partitionCut()), false)
	healed := d.rec.since()
	if err = p.mend(r.id); err != nil {
		d.cutOff.clear()
		return fmt.Sprintf("heal failed: %v", err)
	}
	// As after a pause: the held write goes out once the successor has
	// written (or a cap), to test that the fence rejects it. Released
	// before, it could land first and be followed by the successor's: a
	// duplicate that fencing does not promise to prevent.
	d.redeliverUntil(ctx, ev, time.Now().Add(10*d.cfg.TTL+2*d.cfg.WorkMax), true)
	d.cutOff.clear()
	sleep(ctx, d.cfg.TTL) // the held write lands
	end, how := d.cutOff.ended()
	f := cutFacts{what: what, id: r.id, job: job, cut: cut, healed: healed, leaseEnd: end, how: how, permits: d.cfg.Workload == WorkloadSemaphore}
	var note string
	// Under the recorder's lock: the replicas are still recording.
	d.rec.count(func(h *History) { note = partitionNote(h, f, d.cfg.TTL) })
	return note
}

// cutFacts is what the partition fault saw: replica id, on job, cut off at
// cut and healed at healed; its lease ended at leaseEnd (0: not by the
// note), how says why (abandoned, lost, expired; "" for a release).
type cutFacts struct {
	what        string
	id, job     int
	cut, healed time.Duration
	leaseEnd    time.Duration
	how         string
	permits     bool // a semaphore: other holders share the key
}

// partitionNote describes what a partition did to the lease the cut
// replica held: when it stopped trusting it, when another replica was
// granted the key, and the stale writes the register rejected.
func partitionNote(h *History, f cutFacts, ttl time.Duration) string {
	head := fmt.Sprintf("%s for %v", f.what, fmtDur(f.healed-f.cut))
	held := heldAt(h, f.id, f.cut)
	if held == nil {
		return head + fmt.Sprintf(", replica %d on job %d; its lease had ended by the cut", f.id, f.job)
	}
	trust := "it still trusted its lease after the heal"
	if f.leaseEnd != 0 {
		trust = fmt.Sprintf("it stopped trusting its lease %v after the cut (%s)", fmtDur(f.leaseEnd-f.cut), cmp.Or(f.how, "released"))
	}
	return strings.Join([]string{
		head + fmt.Sprintf(", replica %d holding %s", f.id, held.Key),
		trust,
		nextHolder(h, f, held.Key, ttl),
		fmt.Sprintf("%d stale writes rejected", staleBetween(h, f.cut, f.healed+ttl)),
	}, "; ")
}

// heldAt returns the latest section of replica id open at cut, or nil.
func heldAt(h *History, id int, cut time.Duration) *Section {
	var held *Section
	for i := range h.Sections {
		s := &h.Sections[i]
		open := s.Start <= cut && (s.End == 0 || s.End > cut)
		if s.Replica == id && open && (held == nil || s.Start > held.Start) {
			held = s
		}
	}
	return held
}

// nextHolder says when another replica was granted key after the cut.
func nextHolder(h *History, f cutFacts, key string, ttl time.Duration) string {
	next := time.Duration(-1)
	for _, s := range h.Sections {
		if s.Key == key && s.Replica != f.id && s.Start > f.cut && (next < 0 || s.Start < next) {
			next = s.Start
		}
	}
	switch {
	case f.permits && next >= 0:
		return fmt.Sprintf("the next permit of %s went to another replica %v after the cut", key, fmtDur(next-f.cut))
	case next < 0:
		return fmt.Sprintf("nobody else was granted %s by %v after the heal", key, fmtDur(ttl))
	case f.leaseEnd == 0 || next < f.leaseEnd:
		return fmt.Sprintf("another replica was granted it %v after the cut, while the cut holder still trusted its lease", fmtDur(next-f.cut))
	}
	return fmt.Sprintf("another replica was granted it %v after the cut (%v after the cut holder stopped)", fmtDur(next-f.cut), fmtDur(next-f.leaseEnd))
}
