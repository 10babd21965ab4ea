package leasehold

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// ConfigChecker is an optional Store capability: a read of the server
// settings that can lose a lock without any error (Redis eviction, for
// one). A Locker calls it once, in the background, after its first
// acquisition, and reports each warning as an EventConfigWarning and one
// log record; no acquire waits for it. `leasehold doctor` runs the full set
// of checks.
type ConfigChecker interface {
	// CheckConfig returns one ConfigWarning per setting that can lose a
	// lock, none when every setting it can read is safe. It returns an
	// error wrapping ErrConfigNotChecked when the server refuses the reads
	// (a user without the right), naming the right.
	CheckConfig(ctx context.Context) ([]ConfigWarning, error)
}

// ErrConfigNotChecked is returned by ConfigChecker.CheckConfig when the
// store's user may not read the settings.
var ErrConfigNotChecked = errors.New("leasehold: store settings not checked")

// ConfigWarning is a store setting that can lose a lock.
type ConfigWarning struct {
	// Check names the setting (stable, snake_case: "redis_eviction"), as
	// `leasehold doctor` and docs/runbook.md name it.
	Check string
	// Seen is what the server reported; Fix the configuration that resolves it.
	Seen, Fix string
}

// configCheckTimeout bounds a Locker's one background configuration check.
const configCheckTimeout = 10 * time.Second

// checkConfigOnce starts, on the first call, the Locker's one check of its
// store's settings in a goroutine that Close cancels and waits for.
func (l *Locker) checkConfigOnce() {
	if l.configChecked.Load() {
		return
	}
	cc, ok := l.store.(ConfigChecker)
	if !ok {
		l.configChecked.Store(true)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || !l.configChecked.CompareAndSwap(false, true) {
		return
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, configCheckTimeout)
		defer cancel()
		l.reportConfig(cc.CheckConfig(ctx))
	}()
}

func (l *Locker) reportConfig(ws []ConfigWarning, err error) {
	log := l.opts.Logger.With(slog.String("locker", l.opts.Name))
	switch {
	case errors.Is(err, ErrConfigNotChecked):
		log.Info("leasehold: store settings not checked", slog.Any("error", err))
	case err != nil && l.ctx.Err() == nil:
		log.Debug("leasehold: store settings check failed", slog.Any("error", err))
	}
	for _, w := range ws {
		l.observe(Event{Kind: EventConfigWarning, Op: w.Check, Err: errors.New(w.Seen)})
		log.Warn("leasehold: store setting can lose locks", slog.String("check", w.Check),
			slog.String("seen", w.Seen), slog.String("fix", w.Fix))
	}
}
