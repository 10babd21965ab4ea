package drill

import (
	"math"
	"sync"
	"time"
)

// Op is one register operation as a client saw it: when it was called, when
// it returned and what it returned. Times are offsets from the drill's start.
type Op struct {
	Client   int           `json:"client"` // replica index, from 0
	Job      int           `json:"job"`
	Section  int           `json:"section"` // the lease (Section.ID) the op ran under
	Write    bool          `json:"write"`   // a write; otherwise a read
	Fence    uint64        `json:"fence"`   // write: the fence sent; read: the fence returned
	Value    string        `json:"value"`   // write: the value sent; read: the value returned
	Found    bool          `json:"found,omitempty"`
	Accepted bool          `json:"accepted,omitempty"`
	Err      string        `json:"err,omitempty"` // why a write was refused, when not stale
	Call     time.Duration `json:"call_ns"`
	Return   time.Duration `json:"return_ns"`
}

// Section is one lease a replica held on a job: from the acquire's return
// until the holder released it, lost it or died.
type Section struct {
	ID          int           `json:"id"`
	Replica     int           `json:"replica"`
	Incarnation int           `json:"incarnation"` // process generation: a crashed replica restarts as the next
	Job         int           `json:"job"`
	Key         string        `json:"key"`
	Token       string        `json:"-"`
	Fence       uint64        `json:"fence"`
	Degraded    bool          `json:"degraded,omitempty"`
	Takeover    bool          `json:"takeover,omitempty"` // acquired by a redelivery that waited for the key
	Start       time.Duration `json:"start_ns"`
	End         time.Duration `json:"end_ns"`
	PauseStart  time.Duration `json:"pause_start_ns,omitempty"`
	PauseEnd    time.Duration `json:"pause_end_ns,omitempty"`
	Outcome     string        `json:"outcome"`
	Worked      bool          `json:"worked,omitempty"` // reached its write
}

// Window is a fault as injected: what, from when, to when.
type Window struct {
	Fault Fault         `json:"fault"`
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
	Note  string        `json:"note,omitempty"`
	// Skipped: the fault could not be injected (Note says why).
	Skipped bool `json:"skipped,omitempty"`
}

// Acquisition is a successful store acquire (of a lock or a permit),
// recorded at its return (At); Call is when it was sent.
type Acquisition struct {
	Key     string        `json:"key"`
	Token   string        `json:"-"`
	Fence   uint64        `json:"fence"`
	Replica int           `json:"replica"`
	Call    time.Duration `json:"call_ns,omitempty"`
	At      time.Duration `json:"at_ns"`
}

// Stop is a holder that stopped without releasing: crashed or paused.
type Stop struct {
	Fault   Fault         `json:"fault"`
	Replica int           `json:"replica"`
	Key     string        `json:"key"`
	Token   string        `json:"-"`
	At      time.Duration `json:"at_ns"`
}

// Anomaly is one observation that breaks an invariant.
type Anomaly struct {
	At     time.Duration `json:"at_ns"`
	Key    string        `json:"key"`
	Detail string        `json:"detail"`
}

// Call is when a store call was sent and when it returned. Latest, when
// set, is the latest time a call that failed may still have been applied (a
// request held on the way after the client gave up).
type Call struct {
	Call, Return, Latest time.Duration
}

// History is everything a drill recorded; the checker reads only this.
type History struct {
	Ops          []Op          `json:"ops"`
	Sections     []Section     `json:"sections"`
	Windows      []Window      `json:"windows"`
	Acquisitions []Acquisition `json:"acquisitions"`
	Stops        []Stop        `json:"stops"`
	// Applied maps a token to its store calls that extended its lock
	// (acquire, renew; also when the reply was lost). The store applied each
	// somewhere between its Call and its Return.
	Applied map[string][]Call `json:"-"`
	// Restarts are the times the store lost its data.
	Restarts []time.Duration `json:"restarts_ns,omitempty"`
	// Failovers are the failover faults, from the request to the moment
	// the new master was in place (every sentinel named it; the standby was
	// promoted).
	Failovers []Span `json:"failovers,omitempty"`
	// Stuck are locks seen in the store after TTL past their last applied
	// acquire or renew.
	Stuck []Anomaly `json:"stuck,omitempty"`
	// Beliefs are moments a client trusted a lease the store did not hold
	// for it.
	Beliefs []Anomaly `json:"beliefs,omitempty"`
	// BeliefChecks counts ownership checks made; BeliefUnchecked the ones the
	// store could not answer in time.
	BeliefChecks, BeliefUnchecked int
	// BeliefsAfterRestart counts leases trusted after a restart dropped them
	// (expected until the next renewal; not a violation).
	BeliefsAfterRestart int
	// FailoverBeliefs are the Beliefs seen from a failover's request until
	// failoverSettle after the sentinels agreed: a holder still trusting a
	// lease of the old master (the two-holder window a failover opens). The
	// checker counts them apart when the fence rejected every stale write.
	FailoverBeliefs []Anomaly `json:"failover_beliefs,omitempty"`
	// Events counts the lockers' and register's observer events by kind.
	Events map[string]int `json:"events"`
	// Jobs is the number of jobs; Done the ones with an accepted write.
	Jobs, Done int
	// Duration is the workload's length.
	Duration time.Duration `json:"duration_ns"`
	// Workers are the worker processes (Config.Processes), one per replica
	// incarnation.
	Workers []Worker `json:"workers,omitempty"`
}

// Span is a stretch of the drill's clock.
type Span struct {
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
}

// Worker is one worker process (Config.Processes): one incarnation of a
// replica, from its start to its exit.
type Worker struct {
	Replica     int           `json:"replica"`
	Incarnation int           `json:"incarnation"`
	PID         int           `json:"pid"`
	Start       time.Duration `json:"start_ns"`
	End         time.Duration `json:"end_ns"`
	// Exit says how it ended: "stopped" (exited after the drill closed its
	// stdin), "killed" (SIGKILL: the crash fault, or a worker that did not
	// stop in time), or the exit status of a worker that failed.
	Exit string `json:"exit"`
	// Stops counts the SIGSTOPs it got (the pause fault).
	Stops int `json:"sigstops,omitempty"`
}

// recorder collects a History from concurrent goroutines.
type recorder struct {
	t0 time.Time

	mu       sync.Mutex
	h        History
	inflight map[string]int
	// lastRelease is, per key, the latest moment an applied release of it
	// returned (plus its lateness when its reply was lost).
	lastRelease map[string]time.Duration
	revivals    []time.Duration // store restarts that kept every lock (etcd)
	failing     bool            // a failover is under way
}

func newRecorder() *recorder {
	return &recorder{
		t0:          time.Now(),
		inflight:    make(map[string]int),
		lastRelease: make(map[string]time.Duration),
		h:           History{Applied: make(map[string][]Call), Events: make(map[string]int)},
	}
}

// since returns the offset of now from the drill's start (monotonic).
func (r *recorder) since() time.Duration { return time.Since(r.t0) }

func (r *recorder) openSection(s Section) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	s.ID = len(r.h.Sections)
	r.h.Sections = append(r.h.Sections, s)
	return s.ID
}

func (r *recorder) section(id int, f func(*Section)) {
	r.count(func(h *History) { f(&h.Sections[id]) })
}

func (r *recorder) stop(s Stop) {
	r.count(func(h *History) { h.Stops = append(h.Stops, s) })
}

// failoverSettle is how long after the sentinels agree a client may still
// be granted and trust a lease on the old master: Sentinel turns a master
// that still answers into a replica only once it has reported itself a
// master for 8 s (SENTINEL_PUBLISH_PERIOD × 4), checked every second; and
// go-redis's failover client can go back to the old master when a sentinel
// that has not yet switched answers its dial.
const failoverSettle = 10 * time.Second

// failoverStart records that a failover was requested now and returns its
// index for failoverEnd.
func (r *recorder) failoverStart() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.since()
	r.h.Failovers = append(r.h.Failovers, Span{Start: now, End: now})
	r.failing = true
	return len(r.h.Failovers) - 1
}

// failoverEnd records that the new master is in place now: the sentinels
// agreed on it, or the standby was promoted.
func (r *recorder) failoverEnd(i int) {
	r.mu.Lock()
	r.h.Failovers[i].End = r.since()
	r.failing = false
	r.mu.Unlock()
}

// inFailover reports whether a failover is under way or at lies between a
// failover's request and failoverSettle after its end.
func (r *recorder) inFailover(at time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failing || r.h.inFailover(at)
}

// revive records that a store restart kept every lock and extended it by
// extend: each lock may live until TTL after now + extend.
func (r *recorder) revive(extend time.Duration) {
	r.mu.Lock()
	r.revivals = append(r.revivals, r.since()+extend)
	r.mu.Unlock()
}

// lastRevival returns the latest revival (0 if none): a lock seen now may
// have been extended then.
func (r *recorder) lastRevival() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Duration
	for _, x := range r.revivals {
		last = max(last, x)
	}
	return last
}

func (r *recorder) event(kind string) { r.count(func(h *History) { h.Events[kind]++ }) }

// begin marks a store call for token in flight.
func (r *recorder) begin(token string) { r.count(func(*History) { r.inflight[token]++ }) }

// endAt marks a call of token sent at call returned at now; applied says
// the store extended token's lock, at the latest late after now.
func (r *recorder) endAt(token string, call, now time.Duration, applied bool, late time.Duration) {
	r.mu.Lock()
	r.inflight[token]--
	if r.inflight[token] == 0 {
		delete(r.inflight, token)
	}
	if applied {
		r.h.Applied[token] = append(r.h.Applied[token], Call{Call: call, Return: now, Latest: now + late})
	}
	r.mu.Unlock()
}

func (r *recorder) acquired(a Acquisition) {
	r.count(func(h *History) { h.Acquisitions = append(h.Acquisitions, a) })
}

// released records that a release of key (or an acquire, on a store with
// driver.PresenceKeeper) was applied, at the latest at latest: it may have
// granted key to the head of its queue.
func (r *recorder) released(key string, latest time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastRelease[key] = max(r.lastRelease[key], latest)
}

// lastGrant returns the latest moment a release may have granted key to a
// waiter (0 when no release of key was recorded).
func (r *recorder) lastGrant(key string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastRelease[key]
}

// lastApplied returns token's last applied call, whether a call is in
// flight, and whether the token is known at all.
func (r *recorder) lastApplied(token string) (last time.Duration, busy, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.h.Applied[token] {
		last, known = max(last, c.Return, c.Latest), true
	}
	return last, r.inflight[token] > 0, known
}

func (r *recorder) restartedSince(t time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.h.restartIn(t, math.MaxInt64)
}

func (r *recorder) anomaly(list *[]Anomaly, a Anomaly) {
	r.count(func(*History) { *list = append(*list, a) })
}

// stuck records a lock seen stuck at at, unless the same key was reported
// less than a second before.
func (r *recorder) stuck(key string, at time.Duration, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.h.Stuck {
		if a.Key == key && at-a.At < time.Second {
			return
		}
	}
	r.h.Stuck = append(r.h.Stuck, Anomaly{At: at, Key: key, Detail: detail})
}

func (r *recorder) count(f func(h *History)) {
	r.mu.Lock()
	f(&r.h)
	r.mu.Unlock()
}

// snapshot returns the history; the drill calls it once every goroutine
// that records has stopped.
func (r *recorder) snapshot() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.h
}
