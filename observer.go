package leasehold

import "time"

// EventKind says what happened; observers ignore kinds they do not know.
type EventKind int

// Event kinds, with the fields each sets besides Kind, Locker and Key.
const (
	EventAcquire         EventKind = iota + 1 // TryAcquire, Acquire, Hold: Result, Duration (waited), Fence or Err
	EventContention                           // one store answer showed another owner
	EventFailOpen                             // a degraded lease under FailOpen: Err
	EventRenewed                              // Fence, Duration (round trip)
	EventRenewFailed                          // Attempt (failures in a row), Err
	EventAbandoned                            // the budget ran out: Attempt, Err
	EventLost                                 // the store says we no longer own it
	EventExpired                              // the local expiry guard fired
	EventMaxHold                              // MaxHold reached
	EventNotOwned                             // a release or renew answered "not owned": Op
	EventReleased                             // released by its holder: Duration (held)
	EventHeld                                 // any lease's end: Duration (held), Err (the cause)
	EventStoreError                           // Op, Err
	EventStaleWrite                           // a fenced write rejected (package fence): Fence, Op (resource)
	EventPermitWaiting                        // a permit acquire joined the queue; one EventPermitWaitEnded follows
	EventPermitWaitEnded                      // Result, Duration (waited), Fence or Err
	EventConfigWarning                        // a store setting that can lose locks: Op (check), Err (seen)
	EventRenewalBehind                        // renewals sent later than half their slack: Duration (lateness), Attempt (waiting); at most one per RenewInterval
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
	Permit   bool // a Semaphore permit's EventAcquire, EventFailOpen, EventHeld, EventPermitWait*
}

// Observer receives events synchronously and concurrently: Observe must be
// fast and must not call Lease.Release or Locker.Close.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

type nopObserver struct{}

func (nopObserver) Observe(Event) {}
