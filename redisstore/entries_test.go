package redisstore_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// Fences are decimal strings in the scripts, never Lua floats: above 2^53 a
// float cannot tell n from n+1, and the next fence must still be higher.
func TestFenceArithmeticIsExact(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	for _, last := range []uint64{1<<53 + 1, 1<<53 + 2, 1<<63 + 12345, 18446744073709551614} {
		key := "exact:" + strconv.FormatUint(last, 10)
		if err := c.Set(ctx, s.FenceKey(key), strconv.FormatUint(last, 10), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t", TTL: time.Minute})
		if err != nil {
			t.Fatalf("fence key holding %d: %v", last, err)
		}
		if g.Fence != last+1 {
			t.Fatalf("fence key holding %d: expected fence %d, got %d", last, last+1, g.Fence)
		}
		if got, _ := c.Get(ctx, s.FenceKey(key)).Result(); got != strconv.FormatUint(last+1, 10) {
			t.Fatalf("fence key after the acquire: expected %d, got %q", last+1, got)
		}
		info, err := s.Inspect(ctx, key)
		if err != nil || info.Fence != last+1 {
			t.Fatalf("Inspect: expected fence %d, got %+v, %v", last+1, info, err)
		}
	}
}

// Garbage in a fence key is a clear ErrBadEntry that names the Redis key,
// leaves no lock behind and does not rewrite the garbage; deleting the fence
// key (or a force release) recovers at once.
func TestBadFenceIsABadEntry(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	for i, garbage := range []string{"1e300", "abc", "-5", "", "007", "18446744073709551615", "99999999999999999999999"} {
		key := "garbage:" + strconv.Itoa(i)
		if err := c.Set(ctx, s.FenceKey(key), garbage, 24*time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t", TTL: time.Minute})
		if !errors.Is(err, leasehold.ErrBadEntry) || errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("fence key holding %q: expected ErrBadEntry, got %v", garbage, err)
		}
		if !strings.Contains(err.Error(), s.FenceKey(key)) {
			t.Fatalf("fence key holding %q: expected the error to name %s, got %v", garbage, s.FenceKey(key), err)
		}
		if n, _ := c.Exists(ctx, s.LockKey(key)).Result(); n != 0 {
			t.Fatalf("fence key holding %q: the failed acquire left a lock behind", garbage)
		}
		if got, _ := c.Get(ctx, s.FenceKey(key)).Result(); got != garbage {
			t.Fatalf("fence key holding %q: the failed acquire rewrote it to %q", garbage, got)
		}
		if i%2 == 0 { // the runbook's repair: delete the fence key
			if err := c.Del(ctx, s.FenceKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		} else { // or force-release a lock written over the garbage
			if err := c.Set(ctx, s.LockKey(key), "stuck", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ForceRelease(ctx, key); !errors.Is(err, leasehold.ErrBadEntry) {
				t.Fatalf("ForceRelease over a bad fence: expected it to report ErrBadEntry, got %v", err)
			}
		}
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t", TTL: time.Minute})
		if err != nil || g.Fence == 0 {
			t.Fatalf("after the repair of %q: expected a grant, got %+v, %v", garbage, g, err)
		}
	}
}

// A lock key without expiry (written by hand) is reported, not waited on forever.
func TestLockWithoutExpiryIsABadEntry(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	if err := c.Set(ctx, s.LockKey("forever"), "someone", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "forever", Token: "t", TTL: time.Minute}); !errors.Is(err, leasehold.ErrBadEntry) {
		t.Fatalf("Acquire of a lock without expiry: expected ErrBadEntry, got %v", err)
	}
	if _, err := s.Inspect(ctx, "forever"); !errors.Is(err, leasehold.ErrBadEntry) {
		t.Fatalf("Inspect of a lock without expiry: expected ErrBadEntry, got %v", err)
	}
}

// List skips bad entries, reports them with ErrBadEntry, and still returns
// the good ones.
func TestListReportsBadEntries(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	for _, k := range []string{"ls:a", "ls:b", "ls:c", "ls:d"} {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "t", TTL: time.Minute, Holder: "h"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Set(ctx, s.FenceKey("ls:b"), "1e300", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, s.LockKey("ls:c")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, s.LockKey("ls:c"), "f", "v").Err(); err != nil { // wrong type
		t.Fatal(err)
	}
	ls, err := s.List(ctx, "ls:")
	if !errors.Is(err, leasehold.ErrBadEntry) {
		t.Fatalf("List with two bad entries: expected ErrBadEntry, got %v", err)
	}
	if !strings.Contains(err.Error(), `"ls:b"`) || !strings.Contains(err.Error(), `"ls:c"`) {
		t.Fatalf("List: expected the error to name ls:b and ls:c, got %v", err)
	}
	if len(ls) != 2 || ls[0].Key != "ls:a" || ls[1].Key != "ls:d" || ls[0].Holder != "h" {
		t.Fatalf("List: expected the good entries ls:a and ls:d, got %+v", ls)
	}
}
