package etcdproc

import "syscall"

// sysProcAttr makes the etcd process die with this one (Linux only), also
// when this process is killed.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
