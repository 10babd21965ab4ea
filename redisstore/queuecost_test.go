package redisstore_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// TestQueueScriptsReadFewEntries: with 100 waiters queued on a key, the
// scripts of waiting, refreshing, giving up and releasing read a bounded
// number of queue entries, whatever the queue's length. MONITOR shows every
// command a script runs; none may read the whole queue (HGETALL, HKEYS,
// HVALS, or a ZRANGE of more than one member), and no call may run more
// than 20 commands.
func TestQueueScriptsReadFewEntries(t *testing.T) {
	const waiters = 100
	srv := testredis.Start(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	ctx := t.Context()
	key := "cost"
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wait := func(i int) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: fmt.Sprintf("w%d", i), TTL: time.Minute, QueueTTL: time.Minute}
	}
	for i := range waiters {
		if _, err := s.Acquire(ctx, wait(i)); err == nil {
			t.Fatalf("waiter %d: expected a refusal", i)
		}
	}

	conn, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if l, err := rd.ReadString('\n'); err != nil || l != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", l, err)
	}

	type op struct {
		name string
		run  func() error
	}
	ops := []op{
		{"a waiter refreshes its place by acquiring", func() error { _, err := s.Acquire(ctx, wait(50)); return ignoreRefusal(err) }},
		{"a newcomer tries", func() error {
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "try", TTL: time.Minute})
			return ignoreRefusal(err)
		}},
		{"a newcomer queues", func() error { _, err := s.Acquire(ctx, wait(waiters)); return ignoreRefusal(err) }},
		{"RefreshQueue of one place", func() error {
			return s.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "w70", QueueTTL: time.Minute}})[0]
		}},
		{"a waiter gives up", func() error {
			if err := s.Release(ctx, key, "w30"); !errors.Is(err, driver.ErrNotOwned) {
				return fmt.Errorf("expected ErrNotOwned (the key is held), got %v", err)
			}
			return nil
		}},
		{"the holder releases to the head", func() error { return s.Release(ctx, key, "h") }},
		{"the head releases to the next", func() error { return s.Release(ctx, key, "w0") }},
	}
	for i, o := range ops {
		if err := o.run(); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		marker := fmt.Sprintf("queuecost-%d", i)
		if err := s.RefreshQueue(ctx, []driver.QueueRefresh{{Key: marker, Token: "x", QueueTTL: time.Second}})[0]; err == nil {
			t.Fatalf("marker refresh: expected ErrNotQueued")
		}
		n := 0
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("reading MONITOR: %v", err)
			}
			if strings.Contains(l, marker) {
				break
			}
			if !strings.Contains(l, " lua] ") || strings.Contains(l, "queuecost-") {
				continue // the client's calls, an earlier marker's script
			}
			n++
			f := strings.Fields(l[strings.Index(l, " lua] ")+6:])
			cmd := strings.ToLower(strings.Trim(f[0], `"`))
			switch {
			case cmd == "hgetall" || cmd == "hkeys" || cmd == "hvals":
				t.Errorf("%s: reads the whole queue: %s", o.name, strings.TrimSpace(l))
			case cmd == "zrange" && (len(f) < 4 || f[2] != f[3]):
				t.Errorf("%s: reads more than one member of the order: %s", o.name, strings.TrimSpace(l))
			}
		}
		if n > 20 {
			t.Errorf("%s: %d commands inside the script with %d waiters, expected at most 20", o.name, n, waiters)
		}
	}
}

func ignoreRefusal(err error) error {
	if errors.Is(err, driver.ErrNotAcquired) {
		return nil
	}
	return err
}
