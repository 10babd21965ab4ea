package fencetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/memstore"
)

// ReadFunc reads key back from the resource under test: its value and fence,
// or an error matching fence.ErrNotFound when the key was never written.
type ReadFunc func(ctx context.Context, key string) (value []byte, fence uint64, err error)

// Recorder records the operations of concurrent clients on a resource. It is
// safe for concurrent use.
type Recorder struct {
	t0  time.Time
	mu  sync.Mutex
	ops []Op
}

// NewRecorder returns an empty Recorder whose times count from now.
func NewRecorder() *Recorder { return &Recorder{t0: time.Now()} }

func (r *Recorder) add(o Op) {
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
}

// Write writes value to key in res with fence, records the call as client's
// and returns the resource's error. A write rejected as stale (ErrStaleFence)
// is recorded as rejected; any other error as refused (Op.Err).
func (r *Recorder) Write(ctx context.Context, res fence.Resource, client int, key string, token uint64, value string) error {
	call := time.Since(r.t0)
	err := res.Write(ctx, key, token, []byte(value))
	o := Op{Client: client, Key: key, Write: true, Fence: token, Value: value, Accepted: err == nil, Call: call, Return: time.Since(r.t0)}
	if err != nil && !errors.Is(err, fence.ErrStaleFence) {
		o.Err = err.Error()
	}
	r.add(o)
	return err
}

// Read reads key with read and records it as client's. A read that fails
// (other than ErrNotFound) is not recorded: its outcome is unknown.
func (r *Recorder) Read(ctx context.Context, read ReadFunc, client int, key string) error {
	call := time.Since(r.t0)
	v, f, err := read(ctx, key)
	switch {
	case errors.Is(err, fence.ErrNotFound):
		v, f = nil, 0
	case err != nil:
		return err
	}
	r.add(Op{Client: client, Key: key, Fence: f, Value: string(v), Found: err == nil, Call: call, Return: time.Since(r.t0)})
	return nil
}

// Ops returns a copy of the recorded operations.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Config shapes Run. The zero value is valid.
type Config struct {
	// Store hands out the writers' leases and fences. Default: a new
	// memstore. The writers never renew: a lease ends TTL after it was
	// granted.
	Store driver.Store
	// Writers is the number of concurrent writers. Default 4.
	Writers int
	// Keys is the number of keys they contend for. Default 2.
	Keys int
	// Leases is the number of leases each writer takes. Default 8.
	Leases int
	// TTL of every lease. Default 50ms.
	TTL time.Duration
	// Pause is how long a pausing writer sleeps between taking its lease and
	// writing, like a GC pause or a stalled VM: longer than TTL, so another
	// writer takes the key and writes with a newer fence before it wakes.
	// Default 3 × TTL.
	Pause time.Duration
	// PauseEvery makes every PauseEvery-th lease of a writer pause. Default 3.
	PauseEvery int
	// CheckTimeout bounds porcupine. Default 10s.
	CheckTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Store == nil {
		c.Store = memstore.New()
	}
	c.Writers = orInt(c.Writers, 4)
	c.Keys = orInt(c.Keys, 2)
	c.Leases = orInt(c.Leases, 8)
	c.PauseEvery = orInt(c.PauseEvery, 3)
	if c.TTL <= 0 {
		c.TTL = 50 * time.Millisecond
	}
	if c.Pause <= 0 {
		c.Pause = 3 * c.TTL
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = 10 * time.Second
	}
	return c
}

func orInt(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Run drives res the way a fleet of lease holders does and checks the
// recorded history. Writers take leases on a few shared keys from cfg.Store
// and, under each lease, write twice with the lease's fence (the same holder
// writing again must be accepted) and read the key back. Every
// cfg.PauseEvery-th lease pauses past its TTL before writing, so its writes
// reach the resource after a successor's. The history is then checked with
// Check. Run returns an error only when it could not drive the resource
// (a lock store failure, a failed read); a broken resource shows in
// Result.Err.
func Run(ctx context.Context, res fence.Resource, read ReadFunc, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	rec := NewRecorder()
	errs := make(chan error, cfg.Writers)
	var wg sync.WaitGroup
	for w := range cfg.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- writer(ctx, cfg, rec, res, read, w)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return Result{Ops: rec.Ops()}, err
		}
	}
	return Check(rec.Ops(), cfg.CheckTimeout), nil
}

func writer(ctx context.Context, cfg Config, rec *Recorder, res fence.Resource, read ReadFunc, w int) error {
	for i := range cfg.Leases {
		key := "fencetest:" + strconv.Itoa((w+i)%cfg.Keys)
		token := fmt.Sprintf("w%d-l%d", w, i)
		f, err := acquire(ctx, cfg, key, token)
		if err != nil {
			return err
		}
		if (i+1)%cfg.PauseEvery == 0 {
			if err := sleep(ctx, cfg.Pause); err != nil {
				return err
			}
		}
		for n := range 2 {
			// Stale and refused writes are part of the history, not errors.
			_ = rec.Write(ctx, res, w, key, f, fmt.Sprintf("%s#%d", token, n))
		}
		if err := rec.Read(ctx, read, w, key); err != nil {
			return fmt.Errorf("fencetest: read %q: %w", key, err)
		}
		_ = cfg.Store.Release(ctx, key, token) // ErrNotOwned after a pause is expected
	}
	return nil
}

// acquire polls the store until token gets key, and returns its fence.
func acquire(ctx context.Context, cfg Config, key, token string) (uint64, error) {
	for {
		g, err := cfg.Store.Acquire(ctx, driver.AcquireRequest{Key: key, Token: token, TTL: cfg.TTL, Holder: "fencetest"})
		switch {
		case err == nil:
			return g.Fence, nil
		case !errors.Is(err, leasehold.ErrNotAcquired):
			return 0, fmt.Errorf("fencetest: acquire %q: %w", key, err)
		}
		if err := sleep(ctx, cfg.TTL/10); err != nil {
			return 0, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
