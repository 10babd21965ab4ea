package redisstore

import "time"

// Classify exposes the error classification to the Cluster test, which
// feeds it a real CROSSSLOT error (the store's own key names cannot produce
// one).
func (s *Store) Classify(op, key string, err error) error { return s.fail(op, key, err) }

// EvictedSeen is evicted_keys + 1 as the store last read it, 0 before.
func (s *Store) EvictedSeen() int64 { return s.evictedSeen.Load() }

// SetConfirmTimeout sets how long WaitRelease waits for Redis's
// confirmation of a subscription (confirmTimeout).
func (s *Store) SetConfirmTimeout(d time.Duration) { s.notify.confirm = d }
