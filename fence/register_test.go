package fence_test

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/internal/resourcetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newRegisterSubject(t *testing.T) resourcetest.Subject {
	obs := &resourcetest.Counter{}
	r := fence.NewRegister(fence.RegisterOptions{Name: "approval", Observer: obs})
	return resourcetest.Subject{
		Res: r,
		Read: func(_ context.Context, key string) ([]byte, uint64, error) {
			v, f, ok := r.Read(key)
			if !ok {
				return nil, 0, fence.ErrNotFound
			}
			return v, f, nil
		},
		Obs:      obs,
		Resource: "memory",
	}
}

func TestRegister(t *testing.T) { resourcetest.Run(t, newRegisterSubject) }

func TestRegisterRecords(t *testing.T) {
	var recs []fence.Record
	r := fence.NewRegister(fence.RegisterOptions{Resource: "drill", OnWrite: func(rec fence.Record) { recs = append(recs, rec) }})
	ctx := t.Context()
	buf := []byte("v1")
	_ = r.Write(ctx, "k", 5, buf)
	buf[0] = 'X' // the register keeps its own copy
	_ = r.Write(ctx, "k", 4, []byte("v2"))
	_ = r.Write(ctx, "k", 5, []byte("v3"))
	_ = r.Write(ctx, "k", 0, []byte("v4")) // refused before it is decided: no record

	want := []fence.Record{
		{Seq: 1, Key: "k", Fence: 5, Value: []byte("v1"), Accepted: true, Prev: 0},
		{Seq: 2, Key: "k", Fence: 4, Value: []byte("v2"), Accepted: false, Prev: 5},
		{Seq: 3, Key: "k", Fence: 5, Value: []byte("v3"), Accepted: true, Prev: 5},
	}
	if len(recs) != len(want) {
		t.Fatalf("expected %d records, got %d: %+v", len(want), len(recs), recs)
	}
	for i := range want {
		g, w := recs[i], want[i]
		if g.Seq != w.Seq || g.Key != w.Key || g.Fence != w.Fence || string(g.Value) != string(w.Value) || g.Accepted != w.Accepted || g.Prev != w.Prev {
			t.Fatalf("record %d: expected %+v, got %+v", i, w, g)
		}
	}
	if acc, rej := r.Stats(); acc != 2 || rej != 1 {
		t.Fatalf("expected 2 accepted, 1 rejected, got %d, %d", acc, rej)
	}
	v, f, _ := r.Read("k")
	v[0] = 'Z' // Read returns a copy
	if v2, _, _ := r.Read("k"); string(v2) != "v3" || f != 5 {
		t.Fatalf("expected v3@5, got %q@%d", v2, f)
	}
	var se *fence.StaleError
	if err := r.Write(ctx, "k", 1, nil); !errors.As(err, &se) || se.Resource != "drill" {
		t.Fatalf("expected a StaleError naming resource drill, got %v", err)
	}
}

func TestRegisterZeroValue(t *testing.T) {
	var r fence.Register
	ctx := t.Context()
	if err := r.Write(ctx, "k", 2, []byte("a")); err != nil {
		t.Fatalf("zero Register write: %v", err)
	}
	if err := r.Write(ctx, "k", 1, []byte("b")); !errors.Is(err, fence.ErrStaleFence) {
		t.Fatalf("expected ErrStaleFence, got %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.Write(cctx, "k", 3, []byte("c")); !errors.Is(err, context.Canceled) {
		t.Fatalf("expected context.Canceled, got %v", err)
	}
	if v, f, ok := r.Read("k"); !ok || string(v) != "a" || f != 2 {
		t.Fatalf("expected a@2, got %q@%d", v, f)
	}
}
