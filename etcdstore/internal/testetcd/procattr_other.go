//go:build !linux

package testetcd

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; Close and the tests'
// clean-ups stop the process.
func sysProcAttr() *syscall.SysProcAttr { return nil }
