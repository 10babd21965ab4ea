package drill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
)

// host is the drill as a replica's worker loop and store wrapper reach it:
// one call per message of the worker protocol (wire.go). An in-process
// replica calls its session directly; a worker process (Config.Processes)
// sends each message to its session in the drill over its stdout and waits
// for the reply on its stdin. Both modes run the same loop (replica.process)
// and the same handler (session.handle).
type host interface {
	// since is the offset of now from the drill's start.
	since() time.Duration
	randN(n time.Duration) time.Duration
	// call sends m and returns the reply; a notice (see notices) gets none.
	call(m wire) wire
}

// notices are the messages that get no reply.
var notices = map[string]bool{"end": true, "stop": true, "work": true, "begin": true, "ret": true, "acq": true,
	"belief": true, "event": true}

// session is the drill's side of one replica incarnation: it answers the
// incarnation's messages and remembers what a killed process leaves behind
// (its open sections, its store calls in flight).
type session struct {
	d   *drill
	r   *replica
	inc *incarnation
	ctx context.Context // bounds the waits (ownership checks, pauses)
	obs leasehold.Observer

	mu       sync.Mutex
	inflight map[string][]time.Duration // token -> call times of store calls in flight
	open     map[int]openSection        // sections opened and not ended
}

type openSection struct{ key, token string }

var _ host = (*session)(nil)

func (d *drill) newSession(ctx context.Context, r *replica, inc *incarnation) *session {
	return &session{d: d, r: r, inc: inc, ctx: ctx, obs: d.observer(),
		inflight: make(map[string][]time.Duration), open: make(map[int]openSection)}
}

func (s *session) since() time.Duration                { return s.d.rec.since() }
func (s *session) randN(n time.Duration) time.Duration { return s.d.randN(n) }

// call handles m in the caller's goroutine (an in-process replica).
func (s *session) call(m wire) wire {
	reply, err := s.handle(m)
	if err != nil { // the in-process loop only sends what it may
		panic(err)
	}
	return reply
}

// handle answers one message: a notice, or a request.
func (s *session) handle(m wire) (wire, error) {
	if s.notice(m) {
		return wire{}, nil
	}
	d, r := s.d, s.r
	held := m.Job >= 0 && m.Job < d.cfg.Jobs && s.owns(m.Sec)
	switch {
	case m.K == "pick":
		job, finished := d.pickJob()
		return wire{Job: job, OK: finished}, nil
	case m.K == "done":
		return wire{OK: d.isDone(m.Job)}, nil
	case m.K == "open":
		return wire{Sec: s.openSection(m)}, nil
	case m.K == "read" && held:
		v, found := d.read(r.id, m.Job, m.Sec)
		return wire{Value: v, OK: found}, nil
	case m.K == "write" && held:
		return wire{OK: d.write(r.id, m.Job, m.Sec, m.Fence, m.Value)}, nil
	case m.K == "inspect":
		return s.inspect(m.Key), nil
	case m.K == "prewrite" && held:
		if d.pauseReq.take(r) { // take the injector's request
			d.pause(s.ctx, r, s.inc, m.Job, m.Key, m.Token, m.Sec)
		}
		d.cutOff.wait(s.ctx, r.id)
		return wire{}, nil
	}
	return wire{}, fmt.Errorf("unexpected message %q (job %d, section %d)", m.K, m.Job, m.Sec)
}

// notice handles a message that gets no reply; false when m is none.
func (s *session) notice(m wire) bool {
	d, r := s.d, s.r
	switch {
	case m.K == "end":
		if s.closeSection(m.Sec) {
			d.endSection(m.Sec, m.At, m.Text, m.OK)
		}
	case m.K == "stop" && m.Stop != nil:
		st := *m.Stop
		st.Token, st.Replica = m.Token, r.id
		d.rec.stop(st)
	case m.K == "work":
		r.markWorking(m.Job, m.OK)
	case m.K == "begin":
		s.inFlight(m.Token, m.At, true)
		d.rec.begin(m.Token)
	case m.K == "ret":
		s.inFlight(m.Token, m.Call, false)
		d.rec.endAt(m.Token, m.Call, m.At, m.OK, m.Late)
		if m.Flag && m.Key != "" {
			d.rec.released(m.Key, m.At+m.Late)
		}
	case m.K == "handoff":
		d.rec.released(m.Key, m.At+m.Late)
	case m.K == "acq":
		d.rec.acquired(Acquisition{Key: m.Key, Token: m.Token, Fence: m.Fence, Replica: r.id, Call: m.Call, At: m.At})
	case m.K == "event" && m.Event != nil:
		s.obs.Observe(m.Event.event())
	case m.K == "belief" && m.Belief != nil:
		b := *m.Belief
		b.Replica = r.id
		d.recordBelief(b)
	default:
		return false
	}
	return true
}

// inspect asks the store who holds key, for an ownership check.
func (s *session) inspect(key string) wire {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.d.be.observeTimeout())
	defer cancel()
	info, err := s.d.be.observer().Inspect(ictx, key)
	return wire{OK: err == nil || errors.Is(err, leasehold.ErrNotHeld), Flag: err == nil, Token: info.Token,
		Fence: info.Fence}
}

// openSection records a section the replica opened and returns its ID.
func (s *session) openSection(m wire) int {
	var sec Section
	if m.Section != nil {
		sec = *m.Section
	}
	sec.Token, sec.Replica, sec.Incarnation = m.Token, s.r.id, s.inc.n
	id := s.d.rec.openSection(sec)
	s.mu.Lock()
	s.open[id] = openSection{key: sec.Key, token: sec.Token}
	s.mu.Unlock()
	return id
}

// closeSection forgets an open section; false when it was not open.
func (s *session) closeSection(id int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.open[id]
	delete(s.open, id)
	return ok
}

func (s *session) owns(sec int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.open[sec]
	return ok
}

// inFlight adds (or, when it returned, removes) a store call of token sent
// at call.
func (s *session) inFlight(token string, call time.Duration, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls := s.inflight[token]
	if i := slices.Index(calls, call); add {
		calls = append(calls, call)
	} else if i >= 0 {
		calls = slices.Delete(calls, i, i+1)
	}
	if len(calls) == 0 {
		delete(s.inflight, token)
	} else {
		s.inflight[token] = calls
	}
}

// leftBehind takes what a dead incarnation left: its store calls in
// flight and its open sections.
func (s *session) leftBehind() (map[string][]time.Duration, map[int]openSection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inflight, open := s.inflight, s.open
	s.inflight, s.open = map[string][]time.Duration{}, map[int]openSection{}
	return inflight, open
}

func (d *drill) isDone(job int) bool { return job >= 0 && job < len(d.done) && d.done[job].Load() }

func (d *drill) endSection(id int, end time.Duration, outcome string, worked bool) {
	d.rec.section(id, func(s *Section) { s.End, s.Outcome, s.Worked = end, outcome, worked })
}
