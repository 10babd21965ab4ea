package contention

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

func TestSummarize(t *testing.T) {
	ms := int64(time.Millisecond)
	evs := []event{
		{replica: 0, call: 0, got: 1 * ms, rel: 2 * ms},
		{replica: 1, call: 0, got: 3 * ms, rel: 4 * ms},       // hand-off 1 ms
		{replica: 1, call: 4 * ms, got: 5 * ms, rel: 6 * ms},  // reacquired
		{replica: 2, call: 1 * ms, got: 5500000, rel: 7 * ms}, // overlaps the previous holder
	}
	c := Cell{PerReplica: make([]int, 3)}
	summarize(&c, evs)
	if c.Acquisitions != 4 || c.Handoffs != 1 || c.Reacquired != 1 || c.Overlaps != 1 {
		t.Fatalf("acquisitions %d hand-offs %d reacquired %d overlaps %d, want 4 1 1 1", c.Acquisitions, c.Handoffs, c.Reacquired, c.Overlaps)
	}
	if c.HandoffP50 != time.Millisecond {
		t.Fatalf("hand-off p50 %v, want 1ms", c.HandoffP50)
	}
	if got := fmt.Sprint(c.PerReplica); got != "[1 2 1]" {
		t.Fatalf("per replica %s", got)
	}
	if f := c.Fairness(); f != 0.5 {
		t.Fatalf("fairness %v, want 0.5", f)
	}
}

// TestChildLoop runs the replica loop on the memory store for 500 ms. It
// asks for a few acquisitions, not a rate: under load on a shared machine a
// 50 ms window once held a single one.
func TestChildLoop(t *testing.T) {
	start := Mono()
	in := strings.NewReader(fmt.Sprintf("memory\ngo %d %d\n", start, start+int64(500*time.Millisecond)))
	var out bytes.Buffer
	if code := ChildMain([]string{"-store", "-", "-hold", "1ms"}, OpenLeasehold, in, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != "ready" || !strings.HasPrefix(lines[len(lines)-1], "errors 0") {
		t.Fatalf("output: %q", out.String())
	}
	var n int
	for _, l := range lines {
		var call, got, rel int64
		if _, err := fmt.Sscanf(l, "e %d %d %d", &call, &got, &rel); err == nil {
			n++
			if call > got || got+int64(time.Millisecond) > rel {
				t.Fatalf("times out of order or hold shorter than 1 ms: %q", l)
			}
		}
	}
	if n < 3 {
		t.Fatalf("%d acquisitions in 500 ms with a 1 ms hold", n)
	}
}

// A replica's argv never carries the store URL: its password would show in
// ps to every user of the host. The URL goes on stdin.
func TestChildArgsHoldNoURL(t *testing.T) {
	for _, mode := range []string{"loop", "crash"} {
		args := childArgs(Config{Hold: time.Millisecond, TTL: time.Second}, Target{URL: "redis://u:QZJsecretVK@127.0.0.1:1"}, "k", mode)
		if s := strings.Join(args, " "); strings.Contains(s, "QZJ") || strings.Contains(s, "redis://") {
			t.Errorf("%s: the child's argv shows the store URL: %s", mode, s)
		}
	}
}

// With -lockers and -keys a replica runs several Lockers, each taking the
// keys in turn: every line names its Locker and key, and each Locker's
// keys go round-robin. The Lockers share one memory store here (opened
// by URL, each would have its own).
func TestChildLoopLockersKeys(t *testing.T) {
	st := memstore.New()
	open := func(ctx context.Context, url string, ttl time.Duration) (*Opened, error) {
		l, err := leasehold.New(st, leasehold.Options{TTL: ttl})
		if err != nil {
			return nil, err
		}
		return &Opened{Lock: leaseholdLock{l}, Close: func() { _ = l.Close() }}, nil
	}
	start := Mono()
	in := strings.NewReader(fmt.Sprintf("memory\ngo %d %d\n", start, start+int64(500*time.Millisecond)))
	var out bytes.Buffer
	if code := ChildMain([]string{"-store", "-", "-hold", "1ms", "-keys", "3", "-lockers", "2"}, open, in, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	last := map[int]int{} // Locker -> its last key
	perLocker := map[int]int{}
	var o output
	o.lockers = 2
	for l := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		o.parse(1, l)
		var call, got, rel int64
		var locker, key int
		if _, err := fmt.Sscanf(l, "e %d %d %d %d %d", &call, &got, &rel, &locker, &key); err != nil {
			continue
		}
		if k, ok := last[locker]; ok && key != (k+1)%3 {
			t.Fatalf("Locker %d took key %d after key %d, want round-robin: %q", locker, key, k, out.String())
		}
		last[locker] = key
		perLocker[locker]++
	}
	if perLocker[0] < 3 || perLocker[1] < 3 || o.errors != 0 {
		t.Fatalf("acquisitions per Locker %v, errors %d: %q", perLocker, o.errors, out.String())
	}
	c := Cell{PerReplica: make([]int, 4)}
	summarize(&c, o.events)
	if c.PerReplica[2] != perLocker[0] || c.PerReplica[3] != perLocker[1] || c.Overlaps != 0 {
		t.Fatalf("per Locker %v (want replica 1's Lockers at 2 and 3: %v), overlaps %d", c.PerReplica, perLocker, c.Overlaps)
	}
}

// Hand-offs and overlaps are counted between holders of the same key only.
func TestSummarizePerKey(t *testing.T) {
	ms := int64(time.Millisecond)
	evs := []event{
		{replica: 0, key: 0, got: 1 * ms, rel: 3 * ms},
		{replica: 1, key: 1, got: 2 * ms, rel: 4 * ms}, // another key: no overlap
		{replica: 1, key: 0, got: 4 * ms, rel: 5 * ms}, // hand-off 1 ms on key 0
	}
	c := Cell{PerReplica: make([]int, 2)}
	summarize(&c, evs)
	if c.Overlaps != 0 || c.Handoffs != 1 || c.HandoffP50 != time.Millisecond {
		t.Fatalf("overlaps %d hand-offs %d p50 %v, want 0 1 1ms", c.Overlaps, c.Handoffs, c.HandoffP50)
	}
}
