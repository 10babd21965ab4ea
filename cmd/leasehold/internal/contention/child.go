package contention

// This file is the replica process. It must not import leasehold: the same
// file is copied into builds of older leasehold commits and of the peer
// libraries (scripts/bench-contention.sh), so that every variant runs the
// same loop and reports the same way.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is one replica's handle on the lock service: Acquire blocks until the
// key is held or ctx ends, and returns the function that releases it.
type Lock interface {
	Acquire(ctx context.Context, key string) (release func(context.Context) error, err error)
}

// Opened is what an Opener returns: the Lock, a count of store requests
// the replica sent so far (nil when the store is counted on the server),
// and Close.
type Opened struct {
	Lock     Lock
	Requests func() int64
	Close    func()
}

// Opener opens the store at url for one replica, with lease TTL ttl.
type Opener func(ctx context.Context, url string, ttl time.Duration) (*Opened, error)

// Mono returns CLOCK_MONOTONIC in nanoseconds: shared by every process of
// the machine, so timestamps of different replicas compare.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

type childFlags struct {
	url, key, mode string
	hold, ttl      time.Duration
	keys, lockers  int
}

// ChildMain runs one replica with args (see the flags below) and returns
// the exit status. Protocol on stdin/stdout:
//
//	child -> "ready"                       store opened
//	parent -> "go START_NS END_NS"         CLOCK_MONOTONIC times
//	mode loop:  at the end, one "e CALL GOT REL" line per acquisition
//	            (Acquire called, returned, Release about to be sent), then
//	            "rt N" (requests counted by the client, if any) and
//	            "errors N FIRST". With -keys or -lockers above 1 the lines
//	            read "e CALL GOT REL LOCKER KEY": -lockers Lockers, each
//	            opened on its own (its own store client), loop side by
//	            side, each taking the -keys keys KEY:0 .. KEY:N-1 in turn
//	            (round-robin from a random first key), so that every
//	            Locker asks for every key equally often.
//	mode crash: "got CALL GOT" as soon as the key is held, then hold it
//	            without release until killed (the parent sends SIGKILL).
func ChildMain(args []string, open Opener, stdin io.Reader, stdout io.Writer) int {
	var f childFlags
	fs := flag.NewFlagSet("bench-child", flag.ContinueOnError)
	fs.StringVar(&f.url, "store", "", `store URL, or "-" for the first line of stdin (keeps the password out of argv)`)
	fs.StringVar(&f.key, "key", "leasehold-bench:contention", "the contended key")
	fs.StringVar(&f.mode, "mode", "loop", "loop or crash")
	fs.DurationVar(&f.hold, "hold", time.Millisecond, "critical section")
	fs.DurationVar(&f.ttl, "ttl", time.Second, "lease TTL")
	fs.IntVar(&f.keys, "keys", 1, "mode loop: keys KEY:0 .. KEY:N-1 instead of KEY, taken round-robin by each Locker")
	fs.IntVar(&f.lockers, "lockers", 1, "mode loop: Lockers in this process, each opened on its own")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if f.keys < 1 || f.lockers < 1 || (f.mode == "crash" && f.keys*f.lockers != 1) {
		fmt.Fprintln(stdout, "fatal: -keys and -lockers must be >= 1 (1 in mode crash)")
		return 2
	}
	in := bufio.NewReader(stdin)
	if f.url == "-" {
		line, err := in.ReadString('\n')
		if err != nil {
			fmt.Fprintf(stdout, "fatal reading the store URL: %v\n", err)
			return 1
		}
		f.url = strings.TrimSuffix(line, "\n")
	}
	ctx := context.Background()
	opened := make([]*Opened, f.lockers)
	for i := range opened {
		o, err := open(ctx, f.url, f.ttl)
		if err != nil {
			fmt.Fprintf(stdout, "fatal open: %v\n", err)
			return 1
		}
		defer o.Close()
		opened[i] = o
	}
	fmt.Fprintln(stdout, "ready")
	start, end, err := readGo(in)
	if err != nil {
		fmt.Fprintf(stdout, "fatal %v\n", err)
		return 1
	}
	if d := time.Duration(start - Mono()); d > 0 {
		time.Sleep(d)
	}
	runCtx, cancel := context.WithTimeout(ctx, time.Duration(end-Mono()))
	defer cancel()
	if f.mode == "crash" {
		return crash(runCtx, opened[0].Lock, f.key, stdout)
	}
	if f.keys == 1 && f.lockers == 1 {
		loop(runCtx, opened[0], f, []string{f.key}, "", stdout)
		return 0
	}
	keys := make([]string, f.keys)
	for i := range keys {
		keys[i] = f.key + ":" + strconv.Itoa(i)
	}
	outs := make([]strings.Builder, f.lockers)
	var wg sync.WaitGroup
	for i, o := range opened {
		wg.Go(func() { loop(runCtx, o, f, keys, " "+strconv.Itoa(i), &outs[i]) })
	}
	wg.Wait()
	for i := range outs {
		_, _ = io.WriteString(stdout, outs[i].String())
	}
	return 0
}

func readGo(stdin io.Reader) (start, end int64, err error) {
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil {
		return 0, 0, fmt.Errorf("reading go line: %w", err)
	}
	var word string
	if _, err := fmt.Sscan(strings.TrimSpace(line), &word, &start, &end); err != nil || word != "go" {
		return 0, 0, fmt.Errorf("bad go line %q", line)
	}
	return start, end, nil
}

// loop acquires keys in turn until ctx ends, and writes its lines to
// stdout; locker, when not "", is " LOCKER" and the lines of acquisitions
// end with it and the key's index.
func loop(ctx context.Context, o *Opened, f childFlags, keys []string, locker string, stdout io.Writer) {
	var (
		out   strings.Builder
		errs  int
		first error
	)
	next := rand.IntN(len(keys))
	for ctx.Err() == nil {
		k := next
		next = (next + 1) % len(keys)
		call := Mono()
		release, err := o.Lock.Acquire(ctx, keys[k])
		got := Mono()
		if err != nil {
			if ctx.Err() == nil {
				errs++
				first = cmpOr(first, err)
				time.Sleep(time.Millisecond)
			}
			continue
		}
		time.Sleep(f.hold)
		rel := Mono()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := release(rctx); err != nil {
			errs++
			first = cmpOr(first, err)
		}
		rcancel()
		out.WriteString("e " + strconv.FormatInt(call, 10) + " " + strconv.FormatInt(got, 10) + " " + strconv.FormatInt(rel, 10))
		if locker != "" {
			out.WriteString(locker + " " + strconv.Itoa(k))
		}
		out.WriteString("\n")
	}
	if o.Requests != nil {
		fmt.Fprintf(&out, "rt %d\n", o.Requests())
	}
	msg := ""
	if first != nil {
		msg = strings.ReplaceAll(first.Error(), "\n", " ")
	}
	fmt.Fprintf(&out, "errors %d %s\n", errs, msg)
	_, _ = io.WriteString(stdout, out.String())
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func crash(ctx context.Context, l Lock, key string, stdout io.Writer) int {
	for ctx.Err() == nil {
		call := Mono()
		release, err := l.Acquire(ctx, key)
		got := Mono()
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		fmt.Fprintf(stdout, "got %d %d\n", call, got)
		if f, ok := stdout.(*os.File); ok {
			_ = f.Sync()
		}
		<-ctx.Done() // hold until killed
		_ = release(context.Background())
		return 0
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return 0
	}
	return 1
}
