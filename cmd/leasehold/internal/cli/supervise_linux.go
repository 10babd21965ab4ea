package cli

import "syscall"

// selfExecutable is the file of this process's program: /proc/self/exe
// still works after the binary was replaced on disk (an upgrade while run
// waited for its lock).
func selfExecutable() (string, error) { return "/proc/self/exe", nil }

// parentDeathSignal is what the kernel sends the supervisor when its parent
// dies (PR_SET_PDEATHSIG).
const parentDeathSignal = syscall.SIGUSR2

// supervisorAttr starts the supervisor with parentDeathSignal as its
// parent-death signal, in a process group of its own with group (see
// startSupervised).
func supervisorAttr(group bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: parentDeathSignal, Setpgid: group}
}

// commandAttr starts the supervised command, in a process group of its own
// with group, and killed by the kernel should the supervisor die.
func commandAttr(group bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: group, Pdeathsig: syscall.SIGKILL}
}
