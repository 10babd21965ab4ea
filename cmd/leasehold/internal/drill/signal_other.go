//go:build !unix

package drill

import (
	"errors"
	"os"
	"syscall"
)

// processesSupported: without SIGSTOP/SIGCONT there is no process pause.
const processesSupported = false

var errNoSignals = errors.New("drill: SIGSTOP/SIGCONT not supported")

func stopProcess(*os.Process) error { return errNoSignals }
func contProcess(*os.Process) error { return errNoSignals }

func workerSysProcAttr() *syscall.SysProcAttr { return nil }
