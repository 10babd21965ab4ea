package drill

import (
	"errors"
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
// At, OK: applied, Late), handoff (Key, At, Late: an acquire that may have
// handed the key to the queue's head), acq (Key, Token, Fence, At), event
// (Event), belief (Belief).
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

// wireEvent is a leasehold.Event on the wire: its error as text.
type wireEvent struct {
	leasehold.Event
	Err string `json:"Err,omitempty"` // shadows Event.Err
}

func toWireEvent(e leasehold.Event) *wireEvent {
	w := &wireEvent{Event: e}
	if e.Err != nil {
		w.Event.Err, w.Err = nil, e.Err.Error()
	}
	return w
}

func (w *wireEvent) event() leasehold.Event {
	e := w.Event
	if w.Err != "" {
		e.Err = errors.New(w.Err)
	}
	return e
}

// workerHello is the first line on a worker's stdin: who it is and what it
// connects to. It carries the Redis password, so it goes through the pipe,
// never the command line or the environment, and is never printed.
type workerHello struct {
	Replica     int `json:"replica"`
	Incarnation int `json:"incarnation"`
	// T0 is the drill's start on the wall clock (Unix ns): the worker
	// records every time as an offset from it. Parent and workers share
	// one machine clock.
	T0     int64         `json:"t0"`
	Proxy  string        `json:"proxy"` // the fault proxy's address: the worker's only path to Redis
	Prefix string        `json:"prefix"`
	Late   time.Duration `json:"late"` // redisBackend.lateness
	// Config is the drill's, its Store the redis:// URL of the store (the
	// password included).
	Config Config `json:"config"`
}
