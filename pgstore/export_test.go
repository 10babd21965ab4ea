package pgstore

// SweepSQL is the statement of the store's sweep of old free rows.
func SweepSQL(s *Store) string { return s.sweepSQL }

// AcquireSQL and ReleaseSQL are the store's acquire and release statements.
func AcquireSQL(s *Store) string { return s.acquireSQL }

// ReleaseSQL: see AcquireSQL.
func ReleaseSQL(s *Store) string { return s.releaseSQL }

// AcquireFastSQL and ReleaseFastSQL are the fast statements alone.
func AcquireFastSQL(s *Store) string { return s.acquireFastSQL }

// ReleaseFastSQL: see AcquireFastSQL.
func ReleaseFastSQL(s *Store) string { return s.releaseFastSQL }

// LockClass is the class of the store's per-key advisory transaction locks
// (the object is hashtext(key)).
func LockClass(s *Store) int32 { return s.n.lockClass }

// ReleaseBatchSQL is the statement that releases many (key, token) pairs.
func ReleaseBatchSQL(s *Store) string { return s.releaseBatchSQL }

// PendingAcquires is the number of acquires waiting for a slot.
func PendingAcquires(s *Store) int {
	s.acquires.mu.Lock()
	defer s.acquires.mu.Unlock()
	return len(s.acquires.pending)
}
