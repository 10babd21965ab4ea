package drill

import (
	"context"
	"time"

	"github.com/leasehold/leasehold"
)

// host is what a replica's worker loop needs from the drill: the job
// queue, the register, the store's truth for the ownership check, and the
// recorder. *drill is the host of in-process replicas; a worker process
// (Config.Processes) reaches its parent drill through a workerHost, so both
// modes run the same loop (replica.process).
type host interface {
	// since is the offset of now from the drill's start.
	since() time.Duration
	randN(n time.Duration) time.Duration
	// pickJob returns a random job that has arrived and is not done, or -1;
	// finished reports that every job is done.
	pickJob() (job int, finished bool)
	isDone(job int) bool
	// read and write run a register operation and record it; a job found
	// written or written now is marked done.
	read(client, job, section int) (value string, found bool)
	write(client, job, section int, fence uint64, value string) bool
	// openSection records a new lease and returns its ID; endSection ends it.
	openSection(s Section) int
	endSection(id int, end time.Duration, outcome string, worked bool)
	stop(s Stop)
	// checkBelief compares the lease with the store's answer right before
	// the write.
	checkBelief(ctx context.Context, ls *leasehold.Lease, sec *Section)
	// working tells the injector which job r works on under a store lease
	// (fenced) or -1.
	working(replica, job int, fenced bool)
	// beforeWrite is where a pause lands: right before the write.
	beforeWrite(ctx context.Context, r *replica, inc *incarnation, job int, key, token string, section int)
}

// callRecorder records the store calls of one replica process (procStore).
type callRecorder interface {
	since() time.Duration
	// begin marks a call for token in flight and returns when it was sent.
	begin(token string) time.Duration
	// end marks it returned; applied: it extended token's lock, at the
	// latest late after its return.
	end(token string, call time.Duration, applied bool, late time.Duration)
	acquired(a Acquisition)
}

var (
	_ host         = (*drill)(nil)
	_ callRecorder = (*recorder)(nil)
)

func (d *drill) since() time.Duration { return d.rec.since() }

func (d *drill) pickJob() (int, bool) {
	if int(d.doneCount.Load()) == d.cfg.Jobs {
		return -1, true
	}
	return d.pickOpenJob(), false
}

func (d *drill) isDone(job int) bool { return job >= 0 && job < len(d.done) && d.done[job].Load() }

func (d *drill) openSection(s Section) int { return d.rec.openSection(s) }

func (d *drill) endSection(id int, end time.Duration, outcome string, worked bool) {
	d.rec.section(id, func(s *Section) { s.End, s.Outcome, s.Worked = end, outcome, worked })
}

func (d *drill) stop(s Stop) { d.rec.stop(s) }

func (d *drill) working(int, int, bool) {}

func (d *drill) beforeWrite(ctx context.Context, r *replica, inc *incarnation, job int, key, token string,
	section int) {
	if r.takePause() {
		d.pause(ctx, r, inc, job, key, token, section)
	}
}
