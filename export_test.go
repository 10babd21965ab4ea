package leasehold

// SchedulerPasses returns how many times l's scheduler goroutine has looked
// at its deadline heap: one per wake-up.
func SchedulerPasses(l *Locker) int {
	l.sched.mu.Lock()
	defer l.sched.mu.Unlock()
	return l.sched.passes
}
