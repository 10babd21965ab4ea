//go:build linux

package netns

import "syscall"

const sysSetns = syscall.SYS_SETNS
