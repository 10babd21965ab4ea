package drill

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// An event crosses the worker's pipe whole: every field, its error as text
// (the wire form used to drop Permit).
func TestWireEventRoundTrip(t *testing.T) {
	e := leasehold.Event{Kind: leasehold.EventAcquire, Locker: "replica-1", Key: "k", Result: "ok", Op: "acquire",
		Fence: 7, Attempt: 2, Duration: time.Second, Err: errors.New("boom"), Permit: true}
	b, err := json.Marshal(toWireEvent(e))
	if err != nil {
		t.Fatal(err)
	}
	var w wireEvent
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	got := w.event()
	if got.Err == nil || got.Err.Error() != "boom" {
		t.Fatalf("expected the error text to cross, got %v", got.Err)
	}
	got.Err, e.Err = nil, nil
	if got != e {
		t.Errorf("expected %+v after the pipe, got %+v", e, got)
	}
}
