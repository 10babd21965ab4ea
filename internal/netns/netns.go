// Package netns builds a small private network out of Linux network
// namespaces for partition tests and the drill's partition fault, and
// removes it on Close.
//
// A Net is one hub namespace holding a bridge and one namespace per node,
// each node joined to the bridge by a veth pair. Node i has the address
// 10.200.0.(i+1)/24 on its veth; the addresses exist only inside the test's
// own namespaces, nothing is added to or routed from the namespace the test
// runs in, so they cannot clash with a real network. Cut takes a node's link
// down (every packet to and from it is dropped, TCP connections hang as in a
// real partition) and Heal brings it back.
//
// The test process itself stays in its own namespace: it talks to servers
// inside the nodes over unix sockets (a unix socket bound to a file path is
// not scoped to a network namespace), so a partition separates the servers
// from each other and from clients in other nodes, but not from the test.
//
// Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the
// `ip` command (Debian package iproute2, installed by
// scripts/install-test-deps.sh). New returns an error wrapping
// ErrUnavailable, saying which is missing, when either is; tests use package
// netnstest, which skips instead.
package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// ErrUnavailable is wrapped by New and Available when this process cannot
// create namespaces: it is not root, or the `ip` command is missing.
var ErrUnavailable = errors.New("netns: network namespaces unavailable")

// namePrefix starts every namespace this package creates; the creating
// process's pid follows, so New can remove what a killed test left behind.
const namePrefix = "lhns-"

var seq atomic.Int64

// Net is a hub namespace with a bridge and the node namespaces joined to it.
type Net struct {
	hub   string
	Nodes []*Node

	closeOnce sync.Once
}

// Node is one namespace of a Net.
type Node struct {
	// Name is the namespace's name (`ip netns exec NAME ...`).
	Name string
	// IP is the node's address, reachable from the other nodes only.
	IP string

	hubLink string // the hub side of the node's veth pair
}

// New creates a Net of n nodes (1 <= n <= 250). The caller stops what it
// started in the nodes and then calls Close. The error wraps ErrUnavailable
// when namespaces cannot be used here at all; any other error means the
// kernel or `ip` refused a step (what was built is removed).
func New(n int) (*Net, error) {
	if n < 1 || n > 250 {
		return nil, fmt.Errorf("netns: %d nodes: want 1 to 250", n)
	}
	if err := Available(); err != nil {
		return nil, err
	}
	removeStale()
	base := fmt.Sprintf("%s%d-%d-", namePrefix, os.Getpid(), seq.Add(1))
	nt := &Net{hub: base + "hub"}
	if err := nt.build(base, n); err != nil {
		nt.Close()
		return nil, fmt.Errorf("netns: cannot build the network (namespaces not permitted here?): %w", err)
	}
	return nt, nil
}

// Available reports why namespaces cannot be used here (an error wrapping
// ErrUnavailable), or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: creating network namespaces needs root (running as uid %d)", ErrUnavailable, os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: the `ip` command is missing (Debian package iproute2; scripts/install-test-deps.sh installs it): %v", ErrUnavailable, err)
	}
	return nil
}

func (nt *Net) build(base string, n int) error {
	steps := [][]string{
		{"netns", "add", nt.hub},
		{"-n", nt.hub, "link", "set", "lo", "up"},
		{"-n", nt.hub, "link", "add", "br0", "type", "bridge"},
		{"-n", nt.hub, "link", "set", "br0", "up"},
	}
	for i := range n {
		nd := &Node{Name: base + strconv.Itoa(i), IP: "10.200.0." + strconv.Itoa(i+1), hubLink: "h" + strconv.Itoa(i)}
		nt.Nodes = append(nt.Nodes, nd)
		steps = append(steps,
			[]string{"netns", "add", nd.Name},
			[]string{"-n", nd.Name, "link", "set", "lo", "up"},
			[]string{"link", "add", "v0", "netns", nd.Name, "type", "veth", "peer", "name", nd.hubLink, "netns", nt.hub},
			[]string{"-n", nt.hub, "link", "set", nd.hubLink, "master", "br0"},
			[]string{"-n", nt.hub, "link", "set", nd.hubLink, "up"},
			[]string{"-n", nd.Name, "addr", "add", nd.IP + "/24", "dev", "v0"},
			[]string{"-n", nd.Name, "link", "set", "v0", "up"},
		)
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}
	return nil
}

// Cut partitions node i from every other node: its link to the bridge goes
// down, so packets are dropped both ways without any reset.
func (nt *Net) Cut(i int) error {
	if err := ip("-n", nt.hub, "link", "set", nt.Nodes[i].hubLink, "down"); err != nil {
		return fmt.Errorf("netns: cut node %d: %w", i, err)
	}
	return nil
}

// Heal reconnects node i after Cut.
func (nt *Net) Heal(i int) error {
	if err := ip("-n", nt.hub, "link", "set", nt.Nodes[i].hubLink, "up"); err != nil {
		return fmt.Errorf("netns: heal node %d: %w", i, err)
	}
	return nil
}

// Command returns a command that runs name inside the node's namespace
// (`ip netns exec`, which execs name: the process's pid is name's own).
func (nd *Node) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", nd.Name, name}, args...)...)
}

// Close kills whatever still runs in the namespaces and deletes them. It is
// safe to call more than once.
func (nt *Net) Close() {
	nt.closeOnce.Do(func() {
		for _, nd := range nt.Nodes {
			deleteNS(nd.Name)
		}
		deleteNS(nt.hub)
	})
}

func deleteNS(name string) {
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			// Not the test itself: `ip netns pids` judges a process by its
			// main thread, which may be in the namespace for a moment while
			// it dials (DialContext).
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = ip("netns", "del", name)
}

// removeStale deletes namespaces left by test processes that no longer run
// (a test killed before its cleanup).
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], namePrefix) {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(f[0], namePrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		deleteNS(f[0])
	}
}

func ip(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
