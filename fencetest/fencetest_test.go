package fencetest_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// broken is a fenced resource with a wrong check.
type broken struct {
	accept func(fence, stored uint64, set bool) bool
	mu     sync.Mutex
	cells  map[string]cell
}

type cell struct {
	value []byte
	fence uint64
}

func (b *broken) Write(_ context.Context, key string, f uint64, value []byte) error {
	if err := fence.CheckFence(f); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c, set := b.cells[key]
	if !b.accept(f, c.fence, set) {
		return fence.Reporter{Resource: "broken"}.Stale(key, f, c.fence)
	}
	if b.cells == nil {
		b.cells = map[string]cell{}
	}
	b.cells[key] = cell{value: append([]byte(nil), value...), fence: f}
	return nil
}

func (b *broken) Read(_ context.Context, key string) ([]byte, uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.cells[key]
	if !ok {
		return nil, 0, fence.ErrNotFound
	}
	return c.value, c.fence, nil
}

func registerRead(reg *fence.Register) fencetest.ReadFunc {
	return func(_ context.Context, key string) ([]byte, uint64, error) {
		v, f, ok := reg.Read(key)
		if !ok {
			return nil, 0, fence.ErrNotFound
		}
		return v, f, nil
	}
}

func TestRegisterPasses(t *testing.T) {
	reg := fence.NewRegister(fence.RegisterOptions{})
	res, err := fencetest.Run(t.Context(), reg, registerRead(reg), fencetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("expected the register to keep the fence rule, got %v", err)
	}
	if res.Linearizable != porcupine.Ok {
		t.Fatalf("expected porcupine.Ok, got %v", res.Linearizable)
	}
	if res.Rejected == 0 {
		t.Fatalf("expected paused writers to be rejected as stale at least once (%d accepted)", res.Accepted)
	}
	t.Logf("%d ops: %d accepted, %d rejected", len(res.Ops), res.Accepted, res.Rejected)
}

// The checker catches resources with a wrong fence check.
func TestBrokenResourcesFail(t *testing.T) {
	cases := []struct {
		name   string
		accept func(f, stored uint64, set bool) bool
	}{
		{"no fence check", func(uint64, uint64, bool) bool { return true }},
		// Rejects the holder's own second write with the same fence.
		{"strictly greater", func(f, stored uint64, set bool) bool { return !set || f > stored }},
		// Takes any different fence for a new holder, an older one included,
		// and rejects the holder's own second write.
		{"equality only", func(f, stored uint64, set bool) bool { return !set || f != stored }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &broken{accept: c.accept}
			res, err := fencetest.Run(t.Context(), b, b.Read, fencetest.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := res.Err(); !errors.Is(err, fencetest.ErrCheckFailed) {
				t.Fatalf("expected ErrCheckFailed for a resource with %s, got %v (%d ops)", c.name, err, len(res.Ops))
			}
			t.Log(res.Err())
		})
	}
}

// A hand-made history: the paused holder's write with fence 1 lands after
// the successor's fence 2.
func TestCheckFindsStaleWrite(t *testing.T) {
	ms := time.Millisecond
	ops := []fencetest.Op{
		{Client: 1, Key: "k", Write: true, Fence: 2, Value: "b", Accepted: true, Call: 1 * ms, Return: 2 * ms},
		{Client: 0, Key: "k", Write: true, Fence: 1, Value: "a", Accepted: true, Call: 3 * ms, Return: 4 * ms},
	}
	res := fencetest.Check(ops, 0)
	if len(res.Stale) != 1 || res.Stale[0].Write.Fence != 1 || res.Stale[0].After.Fence != 2 {
		t.Fatalf("expected one stale write (fence 1 after 2), got %v", res.Stale)
	}
	if res.Linearizable != porcupine.Illegal {
		t.Fatalf("expected porcupine.Illegal, got %v", res.Linearizable)
	}
	ops[1].Accepted = false
	if err := fencetest.Check(ops, 0).Err(); err != nil {
		t.Fatalf("expected the rejected write to be correct, got %v", err)
	}
	// Unfenced, accepting both writes is a correct plain register.
	ops[1].Accepted = true
	if r := fencetest.Linearizable(ops, false, 0); r != porcupine.Ok {
		t.Fatalf("expected an unfenced register to accept both writes, got %v", r)
	}
}

// A write that failed other than as stale (here: its context had ended, so
// the register wrote nothing) is not a rejection: a correct register's
// history stays correct, whatever its fence.
func TestRefusedWriteIsNotARejection(t *testing.T) {
	reg := fence.NewRegister(fence.RegisterOptions{})
	rec := fencetest.NewRecorder()
	ctx := t.Context()
	if err := rec.Write(ctx, reg, 0, "k", 1, "a"); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := rec.Write(ended, reg, 1, "k", 2, "b"); !errors.Is(err, context.Canceled) {
		t.Fatalf("expected context.Canceled, got %v", err)
	}
	if err := rec.Read(ctx, registerRead(reg), 0, "k"); err != nil {
		t.Fatal(err)
	}
	res := fencetest.Check(rec.Ops(), 0)
	if err := res.Err(); err != nil {
		t.Fatalf("expected a correct history, got %v", err)
	}
	if res.Accepted != 1 || res.Rejected != 0 || res.Refused != 1 {
		t.Fatalf("expected 1 accepted, 0 rejected, 1 refused, got %d, %d, %d", res.Accepted, res.Rejected, res.Refused)
	}
}
