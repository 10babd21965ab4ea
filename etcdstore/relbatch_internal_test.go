package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

func noDetach(ctx context.Context, detached bool) (context.Context, context.CancelFunc) {
	if detached {
		return context.WithCancel(context.WithoutCancel(ctx))
	}
	return context.WithCancel(ctx)
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

// timedStore returns a Store with RequestTimeout d, for begin and request
// without a client.
func timedStore(t *testing.T, d time.Duration) *Store {
	s := &Store{timeout: d}
	s.sess = newSession(s)
	t.Cleanup(s.sess.cancel)
	return s
}

// A transaction queued behind others longer than RequestTimeout is sent
// when its turn comes, while every request ahead of it was answered within
// its own timeout (10,000 keys at once: 100 requests, 2 at a time).
func TestRelBatchQueuedPastTimeout(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := timedStore(t, timeout)
	var b relBatch
	var sent sync.WaitGroup
	send := func(ctx context.Context, calls []*relCall) error { // each request: 0.6 × the timeout
		select {
		case <-time.After(timeout * 6 / 10):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	results := make(chan error, 5)
	run := func(key string) {
		ctx, end, err := s.begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		sent.Add(1)
		go func() {
			defer end()
			sent.Done()
			results <- b.do(ctx, &relCall{key: key}, send, s.request)
		}()
		sent.Wait()
		time.Sleep(10 * time.Millisecond) // in this order
	}
	// a, b go at once; the three calls on k queue and go one a request
	// (one key at most once in a request): the last at 1.2 × the timeout.
	for _, k := range []string{"a", "b", "k", "k", "k"} {
		run(k)
	}
	for range 5 {
		if err := <-results; err != nil {
			t.Fatalf("a call queued behind answered requests: expected it sent and answered, got %v", err)
		}
	}
}

// A request that RequestTimeout ended fails the calls queued behind it at
// once, as ErrUnavailable, without sending them.
func TestRelBatchStallFailsQueue(t *testing.T) {
	s := timedStore(t, 100*time.Millisecond)
	var b relBatch
	var mu sync.Mutex
	var sends int
	send := func(ctx context.Context, calls []*relCall) error { // no answer
		mu.Lock()
		sends++
		mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	results := make(chan error, 4)
	for _, k := range []string{"a", "b", "c", "d"} {
		ctx, end, err := s.begin(context.Background()) // no deadline but the store's
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer end()
			results <- b.do(ctx, &relCall{key: k}, send, s.request)
		}()
	}
	unavailable := 0
	for range 4 {
		if err := <-results; errors.Is(err, ErrUnavailable) {
			unavailable++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if unavailable != 2 || sends != 2 {
		t.Fatalf("expected the 2 queued calls failed as ErrUnavailable and only the 2 requests in flight sent, got %d unavailable, %d sent", unavailable, sends)
	}
}

// After an operation's RequestTimeout passed while it waited in the queue,
// only a deadline error while its caller lives is the timeout: a refusal
// answered later keeps its class, and a caller that gave up gets its own.
func TestWrapAfterQueueWait(t *testing.T) {
	s := timedStore(t, time.Millisecond)
	caller, cancel := context.WithCancel(t.Context())
	ctx, end, err := s.begin(caller)
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	<-ctx.Done()
	if err := s.wrap(ctx, "acquire", "k", context.DeadlineExceeded); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a request the timeout ended: expected ErrUnavailable, got %v", err)
	}
	if err := s.wrap(ctx, "acquire", "k", rpctypes.ErrPermissionDenied); !errors.Is(err, leasehold.ErrAccessDenied) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("a refusal answered after the timeout: expected ErrAccessDenied alone, got %v", err)
	}
	cancel()
	if err := s.wrap(ctx, "acquire", "k", context.Canceled); errors.Is(err, leasehold.ErrUnavailable) {
		t.Fatalf("a caller that gave up: expected its cancellation, not ErrUnavailable, got %v", err)
	}
}
