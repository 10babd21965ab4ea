package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeSends is a sendFunc whose requests block until released, recording
// the keys of each.
type fakeSends struct {
	mu      sync.Mutex
	batches [][]string
	gate    chan struct{} // a request returns when it can receive from gate
	started chan int      // the size of each request, when it is sent
	err     error
}

func (f *fakeSends) send(ctx context.Context, calls []*relCall) error {
	keys := make([]string, len(calls))
	for i, c := range calls {
		keys[i] = c.key
	}
	f.mu.Lock()
	f.batches = append(f.batches, keys)
	f.mu.Unlock()
	f.started <- len(calls)
	select {
	case <-f.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, c := range calls {
		c.succeeded = true
	}
	return f.err
}

func noDetach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(context.WithoutCancel(ctx))
}

// Up to maxRelInFlight releases go alone; the rest queue and go as one
// request when one in flight returns, one key at most once per request, and
// a queued release whose context ends leaves the queue.
func TestRelBatch(t *testing.T) {
	var b relBatch
	f := &fakeSends{gate: make(chan struct{}), started: make(chan int, 16)}
	results := make(chan error, 16)
	run := func(ctx context.Context, key string) {
		go func() { results <- b.do(ctx, &relCall{key: key}, f.send, noDetach) }()
	}
	run(t.Context(), "a")
	run(t.Context(), "b")
	for range maxRelInFlight {
		if n := <-f.started; n != 1 {
			t.Fatalf("a release with %d in flight: expected it sent alone, got a request of %d", maxRelInFlight-1, n)
		}
	}
	waitQueue := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			b.mu.Lock()
			l := len(b.queue)
			b.mu.Unlock()
			if l == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("expected %d queued, got %d", n, l)
			}
			time.Sleep(time.Millisecond)
		}
	}
	run(t.Context(), "c")
	run(t.Context(), "c") // the same key again: not in the same request
	run(t.Context(), "d")
	ctx, cancel := context.WithCancel(t.Context())
	run(ctx, "e")
	waitQueue(4)
	cancel()
	if err := <-results; !errors.Is(err, context.Canceled) {
		t.Fatalf("a queued release whose context ended: expected context.Canceled, got %v", err)
	}
	waitQueue(3)
	f.gate <- struct{}{} // "a" or "b" returns: the queue goes as one request
	if err := <-results; err != nil {
		t.Fatal(err)
	}
	if n := <-f.started; n != 2 {
		t.Fatalf("expected the queue sent as one request of 2 (c, d; the second c waits), got %d", n)
	}
	for range 3 { // the other first request, the batch, then the second c
		f.gate <- struct{}{}
	}
	if n := <-f.started; n != 1 {
		t.Fatalf("expected the second c alone, got a request of %d", n)
	}
	for range 4 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight != 0 || len(b.queue) != 0 {
		t.Fatalf("after every release: expected nothing in flight or queued, got %d, %d", b.inFlight, len(b.queue))
	}
}

// A failed batch fails every release in it; the next release still goes.
func TestRelBatchError(t *testing.T) {
	var b relBatch
	boom := errors.New("boom")
	f := &fakeSends{gate: make(chan struct{}), started: make(chan int, 16), err: boom}
	results := make(chan error, 16)
	for _, k := range []string{"a", "b", "c", "d"} {
		go func() { results <- b.do(t.Context(), &relCall{key: k}, f.send, noDetach) }()
	}
	close(f.gate)
	for range 4 {
		if err := <-results; !errors.Is(err, boom) {
			t.Fatalf("expected every release to fail with the request's error, got %v", err)
		}
	}
	if b.inFlight != 0 || len(b.queue) != 0 {
		t.Fatalf("expected nothing in flight or queued, got %d, %d", b.inFlight, len(b.queue))
	}
}

// A call queued first (the grant of a release that read its queue's head)
// goes in the next request, ahead of a full batch queued before it.
func TestRelBatchFirst(t *testing.T) {
	var b relBatch
	f := &fakeSends{gate: make(chan struct{}), started: make(chan int, 2*maxRelBatch)}
	results := make(chan error, 2*maxRelBatch)
	run := func(c *relCall) {
		go func() { results <- b.do(t.Context(), c, f.send, noDetach) }()
	}
	for i := range maxRelInFlight + maxRelBatch {
		run(&relCall{key: fmt.Sprint("k", i)})
		if i < maxRelInFlight {
			<-f.started
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		l := len(b.queue)
		b.mu.Unlock()
		if l == maxRelBatch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected %d queued, got %d", maxRelBatch, l)
		}
	}
	run(&relCall{key: "grant", first: true})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		l := len(b.queue)
		b.mu.Unlock()
		if l == maxRelBatch+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected %d queued, got %d", maxRelBatch+1, l)
		}
	}
	f.gate <- struct{}{} // one request in flight returns: the next batch goes
	<-f.started
	f.mu.Lock()
	next := f.batches[maxRelInFlight]
	f.mu.Unlock()
	close(f.gate)
	for range maxRelBatch + maxRelInFlight + 1 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Contains(next, "grant") {
		t.Fatalf("expected the call queued first in the next batch, got %v", next)
	}
}
