//go:build !linux

package cli

import "syscall"

// parentDeathSignal is never sent without PR_SET_PDEATHSIG: the supervisor
// notices its parent's death by polling its parent pid.
const parentDeathSignal = syscall.SIGUSR2

func supervisorAttr() *syscall.SysProcAttr { return nil }

func commandAttr(group bool) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: group} }
