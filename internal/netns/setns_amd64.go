//go:build linux

package netns

// sysSetns is setns(2) on linux/amd64 (package syscall lacks the constant
// there).
const sysSetns = 308
