package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchStartTimeout bounds how long WaitRelease waits for etcd to confirm
// the watch when RequestTimeout is negative.
const watchStartTimeout = 5 * time.Second

// WaitRelease implements leasehold.Notifier with an etcd watch on the key
// that passes delete events only. Both a release and an expiry (the lease
// ran out) delete the key, so waiters wake on either; a put does not wake
// them.
//
// WaitRelease returns once etcd confirmed the watch (or fails after
// RequestTimeout), so a release after it
// returns is never missed. The channel (never closed) gets a value after each
// delete, and once more if the watch breaks (its context ended or the watched
// revision was compacted), so a waiter tries again rather than sleeping on a
// dead watch. The client resumes the watch on another member when the one it
// used fails. stop cancels the watch and waits for its goroutine; call it
// exactly once (later calls do nothing).
func (s *Store) WaitRelease(ctx context.Context, key, _ string) (<-chan struct{}, func(), error) {
	if s.closed() {
		return nil, nil, ErrClosed
	}
	startTimeout := s.timeout
	if startTimeout <= 0 {
		startTimeout = watchStartTimeout
	}
	wctx, cancel := context.WithCancel(ctx)
	wch := s.cli.Watch(wctx, s.prefix+key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case wr, ok := <-wch:
		if !ok || !wr.Created || wr.Err() != nil {
			cancel()
			drain(wch)
			err := wr.Err()
			if err == nil {
				err = context.Cause(wctx)
			}
			return nil, nil, wrap("watch", key, err)
		}
	case <-t.C:
		cancel()
		drain(wch)
		return nil, nil, wrap("watch", key, fmt.Errorf("%w: etcd did not confirm the watch within %v", ErrUnavailable, startTimeout))
	}
	released := make(chan struct{}, 1)
	wake := func() {
		select {
		case released <- struct{}{}:
		default:
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wr := range wch {
			if wr.Err() != nil || len(wr.Events) > 0 {
				wake() // only deletes pass the filter
			}
		}
		if wctx.Err() == nil {
			wake() // the watch broke: let the waiter try again
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	return released, stop, nil
}

// drain empties a watch channel whose context was cancelled, until the
// client closes it.
func drain(wch clientv3.WatchChan) {
	for range wch {
	}
}
