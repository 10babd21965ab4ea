package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// subscription is the store's one pub/sub connection on Channel, shared by
// every waiter; its goroutine hands each released key to that key's waiters.
type subscription struct {
	ps   *redis.PubSub
	done chan struct{} // closed when the demux goroutine has exited
}

// WaitRelease implements leasehold.Notifier. The first call opens the store's
// one subscription to Channel and waits until Redis confirmed it, so a release
// after WaitRelease returns is seen; later calls only register the waiter.
// Messages published while the subscription reconnects are lost: waiters then
// wake when the holder's TTL runs out. Expiry sends no notification.
func (s *Store) WaitRelease(ctx context.Context, key, _ string) (<-chan struct{}, func(), error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	if s.sub == nil {
		sub, err := s.subscribe(ctx)
		if err != nil {
			return nil, nil, storeErr("subscribe", s.channel, err)
		}
		s.sub = sub
	}
	ch, stop := s.waiters.Add(key)
	return ch, stop, nil
}

// subscribe opens the subscription and starts its goroutine. s.subMu is held.
func (s *Store) subscribe(ctx context.Context) (*subscription, error) {
	ps := s.c.Subscribe(ctx, s.channel)
	if _, err := ps.Receive(ctx); err != nil { // the subscribe confirmation
		_ = ps.Close()
		return nil, err
	}
	sub := &subscription{ps: ps, done: make(chan struct{})}
	msgs := ps.Channel()
	go func() {
		defer close(sub.done)
		for m := range msgs { // closed by ps.Close in Close
			s.wake(m.Payload)
		}
	}()
	return sub, nil
}

// wake tells key's waiters that it was released.
func (s *Store) wake(key string) { s.waiters.Wake(key) }

// Close stops the shared subscription and waits for its goroutine. It does
// not close the client. Later WaitRelease calls return ErrClosed; the other
// methods keep working. Close is idempotent.
func (s *Store) Close() error {
	s.subMu.Lock()
	sub := s.sub
	s.sub, s.closed = nil, true
	s.subMu.Unlock()
	if sub == nil {
		return nil
	}
	err := sub.ps.Close()
	<-sub.done
	return err
}
