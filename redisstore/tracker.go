package redisstore

import (
	"context"
	"sync"
	"time"
)

// closeTimeout bounds the releases Close sends for what the Store still
// holds or waits for.
const closeTimeout = 2 * time.Second

// tracker remembers the locks a Store acquired and its queue entries that
// it has not released, so that Close can release them (token-checked, with
// the hand-off to the next waiter that a release makes) instead of leaving
// them in Redis until their TTL.
type tracker struct {
	mu    sync.Mutex
	m     map[tracked]time.Time // -> when Redis drops it anyway (TTL or queue deadline)
	prune int                   // prune expired entries when len(m) reaches this
}

type tracked struct{ key, token string }

// acquired records the outcome of an acquire of (key, token) sent at sent:
// granted or no answer (it may have applied: keep it until the TTL), queued
// (until the queue deadline), or refused without queueing (forget it).
func (t *tracker) acquired(key, token string, sent time.Time, ttl, queueTTL time.Duration, granted, failed bool) {
	k := tracked{key, token}
	var until time.Time
	switch {
	case granted || failed:
		until = sent.Add(max(ttl, queueTTL))
	case queueTTL > 0:
		until = sent.Add(queueTTL)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if until.IsZero() {
		delete(t.m, k)
		return
	}
	if t.m == nil {
		t.m, t.prune = make(map[tracked]time.Time), 64
	}
	if _, ok := t.m[k]; !ok && len(t.m) >= t.prune {
		t.dropExpired(sent)
		t.prune = max(64, 2*len(t.m))
	}
	t.m[k] = until
}

// dropExpired forgets entries Redis has dropped by their TTL (a lease whose
// holder never released it). t.mu must be held.
func (t *tracker) dropExpired(now time.Time) {
	for k, until := range t.m {
		if until.Before(now) {
			delete(t.m, k)
		}
	}
}

// renewed moves the end of a tracked lock to ttl from now.
func (t *tracker) renewed(key, token string, ttl time.Duration) {
	k := tracked{key, token}
	t.mu.Lock()
	if until, ok := t.m[k]; ok {
		if end := time.Now().Add(ttl); end.After(until) {
			t.m[k] = end
		}
	}
	t.mu.Unlock()
}

// released forgets (key, token): Redis answered its release.
func (t *tracker) released(key, token string) {
	t.mu.Lock()
	delete(t.m, tracked{key, token})
	t.mu.Unlock()
}

// take returns the entries that may still be in Redis and forgets them all.
func (t *tracker) take(now time.Time) []tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []tracked
	for k, until := range t.m {
		if until.After(now) {
			out = append(out, k)
		}
	}
	t.m = nil
	return out
}

// releaseTracked releases every lock and queue entry the Store still has,
// bounded by closeTimeout; what it cannot release ends at its TTL.
func (s *Store) releaseTracked() {
	left := s.track.take(time.Now())
	if len(left) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	for _, k := range left {
		_ = s.Release(ctx, k.key, k.token) // nil, ErrNotOwned and ErrNotHeld all mean it is gone
		if ctx.Err() != nil {
			return
		}
	}
}
