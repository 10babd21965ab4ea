package leasehold

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// configCheckTimeout bounds a Locker's one background configuration check.
const configCheckTimeout = 10 * time.Second

// checkConfigOnce starts, on the first call, the Locker's one check of its
// store's settings in a goroutine that Close cancels and waits for.
func (l *Locker) checkConfigOnce() {
	if l.configChecked.Load() {
		return
	}
	cc, ok := l.store.(driver.ConfigChecker)
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

func (l *Locker) reportConfig(ws []driver.ConfigWarning, err error) {
	log := l.opts.Logger.With(slog.String("locker", l.opts.Name))
	switch {
	case errors.Is(err, driver.ErrConfigNotChecked):
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
