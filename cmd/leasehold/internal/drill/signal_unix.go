//go:build unix

package drill

import (
	"os"
	"syscall"
)

// processesSupported: worker processes can be paused (SIGSTOP/SIGCONT).
const processesSupported = true

func stopProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func contProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// workerSysProcAttr puts a worker in its own process group, so a Ctrl-C at
// the terminal reaches only the drill, which then stops its workers in
// order.
func workerSysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
