package leasehold

import "time"

// EventKind says what happened. New kinds may be added; observers must ignore
// kinds they do not know.
type EventKind int

// Event kinds, each with the Event fields it sets besides Kind, Locker and Key.
const (
	// EventAcquire is the outcome of TryAcquire, Acquire or Hold: Result
	// (ResultAcquired, ResultContended or ResultError), Duration (time spent
	// waiting), Fence on success, Err on error.
	EventAcquire EventKind = iota + 1
	// EventContention is one store attempt that found another owner.
	EventContention
	// EventFailOpen is a store failure on acquire turned into a degraded,
	// local-only lease by the FailOpen policy: Err.
	EventFailOpen
	// EventRenewed is a successful renewal: Fence, Duration (round trip).
	EventRenewed
	// EventRenewFailed is a renewal attempt that failed: Attempt (consecutive
	// failures so far; 1 for a manual Lease.Renew), Err.
	EventRenewFailed
	// EventAbandoned is a lease abandoned after the renewal failure budget:
	// Attempt, Err.
	EventAbandoned
	// EventLost is a lease the store said we no longer own.
	EventLost
	// EventExpired is a lease cancelled by the local expiry guard.
	EventExpired
	// EventMaxHold is a lease that reached the maximum hold time.
	EventMaxHold
	// EventNotOwned is a release or renew answered "lock not owned": Op.
	EventNotOwned
	// EventReleased is a lease released by its holder: Duration (time held).
	EventReleased
	// EventHeld is the end of any lease, however it ended: Duration (time
	// held), Err (the context's cause).
	EventHeld
	// EventStoreError is a store failure: Op, Err.
	EventStoreError
	// EventStaleWrite is a write rejected at the fenced boundary (package
	// fence): Fence (the stale fence), Op (the resource).
	EventStaleWrite
	// EventPermitWaiting is a Semaphore.Acquire (or Do) that joined the
	// key's queue: its first attempt refused with every permit taken or
	// others ahead. Exactly one EventPermitWaitEnded follows when the wait
	// ends. Permit is set.
	EventPermitWaiting
	// EventPermitWaitEnded ends an EventPermitWaiting: Result (as in
	// EventAcquire: acquired, contended when it gave up, error), Duration
	// (time since EventPermitWaiting), Fence on success, Err on error.
	// Permit is set.
	EventPermitWaitEnded
	// EventConfigWarning is a store setting that can lose a lock, found by
	// the Locker's one check of a ConfigChecker store: Op (the check's
	// name, e.g. "redis_eviction"), Err (what was seen). Key is empty.
	EventConfigWarning
	// EventRenewalBehind says that automatic renewals are sent later than
	// half the slack they have before the local expiry guard: the store, or
	// this process, serves fewer renewals than the held leases need, and
	// leases expire if it lasts. Duration (how late the oldest waiting
	// renewal was sent), Attempt (renewals still waiting), Op "renew"; Key
	// is empty. At most one per RenewInterval.
	EventRenewalBehind
)

var eventNames = [...]string{
	EventAcquire:     "acquire",
	EventContention:  "contention",
	EventFailOpen:    "fail_open",
	EventRenewed:     "renewed",
	EventRenewFailed: "renew_failed",
	EventAbandoned:   "abandoned",
	EventLost:        "lost",
	EventExpired:     "expired",
	EventMaxHold:     "max_hold",
	EventNotOwned:    "not_owned",
	EventReleased:    "released",
	EventHeld:        "held",
	EventStoreError:  "store_error",
	EventStaleWrite:  "stale_write",

	EventPermitWaiting:   "permit_waiting",
	EventPermitWaitEnded: "permit_wait_ended",
	EventConfigWarning:   "config_warning",
	EventRenewalBehind:   "renewal_behind",
}

// String returns a stable snake_case name.
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Acquire results carried by EventAcquire.
const (
	ResultAcquired  = "acquired"
	ResultContended = "contended"
	ResultError     = "error"
)

// Event is one observable thing a Locker (or a fenced resource) did.
type Event struct {
	Kind     EventKind
	Locker   string // the locker's Name: a small fixed set, safe as a metrics label
	Key      string // the full key: for logs and traces, never for metric labels
	Result   string
	Op       string // "acquire", "renew", "release", ... or a resource name
	Fence    uint64
	Attempt  int
	Duration time.Duration
	Err      error
	// Permit is set on the events of a Semaphore's permits that count
	// them: EventAcquire, EventFailOpen and EventHeld of a permit, and
	// EventPermitWaiting and EventPermitWaitEnded.
	Permit bool
}

// Observer receives events. Events that end a lease are reported before its
// context is cancelled. Observe is called synchronously on the hot path
// and from renewal goroutines, concurrently: it must be fast and safe for
// concurrent use. It must not call Lease.Release or Locker.Close: they wait
// until every report about the lease, this call included, has returned. The
// Prometheus adapter is in package prommetrics.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

type nopObserver struct{}

func (nopObserver) Observe(Event) {}
