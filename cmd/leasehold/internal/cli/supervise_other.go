//go:build !linux

package cli

import (
	"os"
	"syscall"
)

// selfExecutable is the file of this process's program.
func selfExecutable() (string, error) { return os.Executable() }

// parentDeathSignal is never sent without PR_SET_PDEATHSIG: the supervisor
// notices its parent's death by polling its parent pid.
const parentDeathSignal = syscall.SIGUSR2

func supervisorAttr(group bool) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: group} }

func commandAttr(group bool) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: group} }
