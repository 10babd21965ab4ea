package drill

import (
	"time"

	"github.com/leasehold/leasehold"
)

// The worker protocol (Config.Processes). The drill writes one workerHello
// line to a worker's stdin, then both sides exchange wire messages as JSON
// lines: the worker's on its stdout, the drill's on the worker's stdin.
//
// Worker to drill, with an ID, answered by a "reply" with the same ID:
//
//	pick      -> Job (-1: none now), OK: every job is done
//	done      Job -> OK: the job is done
//	read      Job, Sec -> Value, OK: found (the drill reads its register)
//	write     Job, Sec, Fence, Value -> OK: accepted
//	open      Section, Token -> Sec: the section's ID in the drill's history
//	inspect   Key -> OK: the store answered, Flag: held, Token, Fence
//	prewrite  Job, Sec, Key, Token -> answered once the worker may write
//	          (after a SIGSTOP/SIGCONT when the drill paused it there)
//
// Worker to drill, no reply: end (Sec, At, Text: outcome, OK: worked),
// stop (Stop), work (Job, OK: fenced), begin (Token, At), ret (Token, Call,
// At, OK: applied, Late), acq (Key, Token, Fence, At), event (Event),
// belief (Belief).
//
// Drill to worker: reply, hint (Job: a redelivered job). Closing the
// worker's stdin tells it to stop: it ends its work, releases its leases
// and exits 0.
type wire struct {
	K       string        `json:"k"`
	ID      uint64        `json:"id,omitempty"`
	Job     int           `json:"job,omitempty"`
	Sec     int           `json:"sec,omitempty"`
	Fence   uint64        `json:"fence,omitempty"`
	Value   string        `json:"value,omitempty"`
	Key     string        `json:"key,omitempty"`
	Token   string        `json:"token,omitempty"`
	OK      bool          `json:"ok,omitempty"`
	Flag    bool          `json:"flag,omitempty"`
	At      time.Duration `json:"at,omitempty"`
	Call    time.Duration `json:"call,omitempty"`
	Late    time.Duration `json:"late,omitempty"`
	Text    string        `json:"text,omitempty"`
	Section *Section      `json:"section,omitempty"`
	Stop    *Stop         `json:"stop,omitempty"`
	Event   *wireEvent    `json:"event,omitempty"`
	Belief  *beliefCheck  `json:"belief,omitempty"`
}

// wireEvent is a leasehold.Event on the wire.
type wireEvent struct {
	Kind     leasehold.EventKind `json:"kind"`
	Locker   string              `json:"locker,omitempty"`
	Key      string              `json:"key,omitempty"`
	Result   string              `json:"result,omitempty"`
	Op       string              `json:"op,omitempty"`
	Fence    uint64              `json:"fence,omitempty"`
	Attempt  int                 `json:"attempt,omitempty"`
	Duration time.Duration       `json:"duration,omitempty"`
	Err      string              `json:"err,omitempty"`
}

func toWireEvent(e leasehold.Event) *wireEvent {
	w := &wireEvent{Kind: e.Kind, Locker: e.Locker, Key: e.Key, Result: e.Result, Op: e.Op, Fence: e.Fence, Attempt: e.Attempt, Duration: e.Duration}
	if e.Err != nil {
		w.Err = e.Err.Error()
	}
	return w
}

func (w *wireEvent) event() leasehold.Event {
	e := leasehold.Event{Kind: w.Kind, Locker: w.Locker, Key: w.Key, Result: w.Result, Op: w.Op, Fence: w.Fence, Attempt: w.Attempt, Duration: w.Duration}
	if w.Err != "" {
		e.Err = wireError(w.Err)
	}
	return e
}

// wireError is an error that crossed the pipe: only its text is left.
type wireError string

func (e wireError) Error() string { return string(e) }

// workerHello is the first line on a worker's stdin: who it is and what it
// connects to. It carries the Redis password, so it goes through the pipe,
// never the command line or the environment, and is never printed.
type workerHello struct {
	Replica     int `json:"replica"`
	Incarnation int `json:"incarnation"`
	Jobs        int `json:"jobs"`
	// T0 is the drill's start on the wall clock (Unix ns): the worker
	// records every time as an offset from it. Parent and workers share
	// one machine clock.
	T0             int64                   `json:"t0"`
	Store          string                  `json:"store"` // redis:// URL, the password included
	Proxy          string                  `json:"proxy"` // the fault proxy's address: the worker's only path to Redis
	Prefix         string                  `json:"prefix"`
	TTL            time.Duration           `json:"ttl"`
	WorkMin        time.Duration           `json:"work_min"`
	WorkMax        time.Duration           `json:"work_max"`
	OnStoreError   leasehold.StorePolicy   `json:"on_store_error"`
	OnRenewFailure leasehold.RenewalPolicy `json:"on_renew_failure"`
	Seed           uint64                  `json:"seed"`
	Late           time.Duration           `json:"late"` // redisBackend.lateness
}
