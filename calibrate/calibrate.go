// Package calibrate turns measured numbers into lease timings: the TTL, the
// renewal interval, the renewal failure budget and the worst takeover time
// after a crash, with a verdict against a takeover SLO.
//
// The rules (SPEC §7):
//
//	TTL            = p99 critical section + jitter budget + guard
//	renew interval = TTL / 3 to start
//	failure budget: renew interval + MaxFailures × renew timeout + the gaps
//	                between retries must end before the local guard
//	                (TTL − drift margin), so the holder abandons the lease
//	                before it expires: Budget, the formula the Locker
//	                itself warns with
//	worst takeover ≈ TTL + detection jitter
//
// A TTL shorter than the critical section loses the lock mid-work; a TTL
// longer than the takeover SLO allows cannot meet it, whatever else is tuned.
package calibrate

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrInput is wrapped by every error about unusable input.
var ErrInput = errors.New("calibrate: invalid input")

// Input is what the operator measured or decided.
type Input struct {
	// P99 is the 99th percentile of the time the lock is held (the critical
	// section). Required, > 0.
	P99 time.Duration
	// Jitter is the budget for network and store tail latency and scheduler
	// pauses. >= 0.
	Jitter time.Duration
	// Guard is extra margin on top. >= 0.
	Guard time.Duration
	// DetectionJitter is how late, after the TTL ran out, a waiter notices
	// and takes over. Default: Jitter.
	DetectionJitter time.Duration
	// SLO is the takeover SLO: the longest acceptable time from a holder's
	// crash to the next owner's first action. Zero means none (no verdict).
	SLO time.Duration
	// RenewTimeout bounds one renewal attempt. Default: the core's default
	// for the computed TTL (RenewTimeoutFor).
	RenewTimeout time.Duration
	// MaxFailures is the number of consecutive failed renewals after which a
	// lease is abandoned. Default 3.
	MaxFailures int
}

// Verdict is the outcome against the takeover SLO.
type Verdict string

// Verdicts.
const (
	// NoSLO: no SLO was given.
	NoSLO Verdict = "no_slo"
	// Meets: the worst takeover fits in the SLO.
	Meets Verdict = "meets_slo"
	// Impossible: even the computed TTL makes the worst takeover exceed the
	// SLO; an input must change.
	Impossible Verdict = "slo_impossible"
)

// Result is the calibration. Durations are exact; the CLI rounds them.
type Result struct {
	Input Input
	// TTL = P99 + Jitter + Guard.
	TTL time.Duration
	// RenewInterval = TTL / 3.
	RenewInterval time.Duration
	// DriftMargin is the core's default drift margin for the TTL: the local
	// expiry guard fires at TTL − DriftMargin.
	DriftMargin time.Duration
	// BudgetTime = Budget.Need(): RenewInterval + MaxFailures ×
	// RenewTimeout + the minimum gaps between retries, when the last allowed
	// renewal attempt has failed, measured from the last success.
	BudgetTime time.Duration
	// BudgetHeadroom = TTL − DriftMargin − BudgetTime: time left before the
	// local guard when the lease is abandoned. Negative means the failure
	// budget is not usable (the local expiry guard fires first).
	BudgetHeadroom time.Duration
	// BudgetOK reports BudgetHeadroom >= 0 (Budget.Fits).
	BudgetOK bool
	// SafeRenewInterval is the longest renew interval (at least
	// MinRenewInterval) with which MaxFailures fits; zero when
	// none does.
	SafeRenewInterval time.Duration
	// SafeMaxFailures is the largest failure budget that fits at
	// RenewInterval (0 when none does).
	SafeMaxFailures int
	// WorstTakeover = TTL + DetectionJitter.
	WorstTakeover time.Duration
	// Verdict against Input.SLO.
	Verdict Verdict
	// Slack = SLO − WorstTakeover (negative when impossible; 0 with NoSLO).
	Slack time.Duration
	// Advice lists what to change, most useful first, each naming an input.
	Advice []string
	// Warnings list problems that do not decide the verdict.
	Warnings []string
}

// Compute applies the rules to in. It returns an error wrapping ErrInput
// naming the field to fix.
func Compute(in Input) (Result, error) {
	if err := validate(in); err != nil {
		return Result{}, err
	}
	jitterTwice := in.DetectionJitter == 0 // jitter counts in the TTL and in detection
	if jitterTwice {
		in.DetectionJitter = in.Jitter
	}
	if in.MaxFailures == 0 {
		in.MaxFailures = DefaultMaxFailures
	}
	ttl := in.P99 + in.Jitter + in.Guard
	b := Budget{TTL: ttl, RenewInterval: ttl / 3, DriftMargin: DriftMargin(ttl),
		RenewTimeout: in.RenewTimeout, MaxRenewFailures: in.MaxFailures}
	if b.RenewTimeout == 0 {
		b.RenewTimeout = RenewTimeoutFor(ttl, b.RenewInterval, b.DriftMargin, in.MaxFailures)
		in.RenewTimeout = b.RenewTimeout
	}

	r := Result{Input: in, TTL: ttl, RenewInterval: b.RenewInterval, DriftMargin: b.DriftMargin}
	r.BudgetTime = b.Need()
	r.BudgetHeadroom = b.Have() - b.Need()
	r.BudgetOK = b.Fits()
	r.SafeRenewInterval, r.SafeMaxFailures = safeBudget(b)
	r.WorstTakeover = r.TTL + in.DetectionJitter

	if in.RenewTimeout >= r.RenewInterval {
		r.Warnings = append(r.Warnings, fmt.Sprintf(
			"renew timeout %v is not shorter than the renew interval %v: a slow renewal delays the next one; lower --renew-timeout",
			rd(in.RenewTimeout), rd(r.RenewInterval)))
	}
	if !r.BudgetOK {
		w := fmt.Sprintf("failure budget leaves no time before expiry: renew interval %v + %d × %v renew timeout + gaps = %v > %v (TTL − drift margin %v); the local expiry guard fires before the budget is used up",
			rd(r.RenewInterval), in.MaxFailures, rd(in.RenewTimeout), rd(r.BudgetTime), rd(b.Have()), rd(r.DriftMargin))
		var fixes []string
		if r.SafeMaxFailures >= 1 {
			fixes = append(fixes, fmt.Sprintf("lower --max-failures to %d", r.SafeMaxFailures))
		}
		if r.SafeRenewInterval > 0 {
			fixes = append(fixes, fmt.Sprintf("renew every %v instead of TTL/3", rd(r.SafeRenewInterval)))
		}
		if len(fixes) > 0 {
			w += "; " + strings.Join(fixes, " or ")
		}
		r.Warnings = append(r.Warnings, w)
	}

	if in.SLO == 0 {
		r.Verdict = NoSLO
		return r, nil
	}
	r.Slack = in.SLO - r.WorstTakeover
	if r.Slack >= 0 {
		r.Verdict = Meets
		return r, nil
	}
	r.Verdict = Impossible
	r.Advice = advise(in, r, jitterTwice)
	return r, nil
}

// MaxInput is the longest duration Compute accepts in any field: far beyond
// any sensible lease, and small enough that no sum of the inputs overflows
// time.Duration (about 292 years).
const MaxInput = 10000 * time.Hour

// validate returns an error wrapping ErrInput naming the field to fix.
func validate(in Input) error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"p99 critical section", in.P99}, {"jitter", in.Jitter}, {"guard", in.Guard},
		{"detection jitter", in.DetectionJitter}, {"SLO", in.SLO}, {"renew timeout", in.RenewTimeout}} {
		if f.d > MaxInput {
			return fmt.Errorf("%w: %s must be at most %v, got %v", ErrInput, f.name, MaxInput, f.d)
		}
	}
	switch {
	case in.P99 <= 0:
		return fmt.Errorf("%w: p99 critical section must be > 0, got %v", ErrInput, in.P99)
	case in.Jitter < 0:
		return fmt.Errorf("%w: jitter must be >= 0, got %v", ErrInput, in.Jitter)
	case in.Guard < 0:
		return fmt.Errorf("%w: guard must be >= 0, got %v", ErrInput, in.Guard)
	case in.DetectionJitter < 0:
		return fmt.Errorf("%w: detection jitter must be >= 0, got %v", ErrInput, in.DetectionJitter)
	case in.SLO < 0:
		return fmt.Errorf("%w: SLO must be >= 0, got %v", ErrInput, in.SLO)
	case in.RenewTimeout < 0:
		return fmt.Errorf("%w: renew timeout must be > 0, got %v", ErrInput, in.RenewTimeout)
	case in.MaxFailures < 0:
		return fmt.Errorf("%w: max failures must be >= 1, got %d", ErrInput, in.MaxFailures)
	}
	return nil
}

// safeBudget returns the longest renew interval with which b's failure
// budget fits, and the largest failure budget that fits at b's interval
// (zero when none does).
func safeBudget(b Budget) (time.Duration, int) {
	var interval time.Duration
	if fit := b.RenewInterval + b.Have() - b.Need(); fit >= MinRenewInterval {
		interval = fit
	}
	gap := MinRenewInterval
	failures := 0
	if span := b.Have() - b.RenewInterval + gap; span > 0 {
		failures = int(span / (b.RenewTimeout + gap))
	}
	return interval, failures
}

// advise names the inputs that close the gap between the worst takeover and
// the SLO, the ones that can close it alone first.
func advise(in Input, r Result, jitterTwice bool) []string {
	gap := -r.Slack
	var alone, partial []string
	type knob struct {
		flag  string
		value time.Duration
		times time.Duration // the takeover drops this many times what the input drops
		what  string
	}
	knobs := []knob{
		{"--p99", in.P99, 1, "shorten or split the critical section"},
		{"--guard", in.Guard, 1, "accept a thinner margin"},
	}
	if jitterTwice {
		knobs = append(knobs, knob{"--jitter", in.Jitter, 2, "cut store and network tail latency; it counts in the TTL and in detection"})
	} else {
		knobs = append(knobs,
			knob{"--jitter", in.Jitter, 1, "cut store and network tail latency"},
			knob{"--detection-jitter", in.DetectionJitter, 1, "wake waiters sooner"})
	}
	for _, k := range knobs {
		if k.value <= 0 {
			continue
		}
		if k.value*k.times > gap {
			cut := (gap + k.times - 1) / k.times // ceil
			alone = append(alone, fmt.Sprintf("lower %s from %v to at most %v (%s)", k.flag, rd(k.value), rd(k.value-cut), k.what))
		} else {
			partial = append(partial, fmt.Sprintf("%s (%v) can give back at most %v", k.flag, rd(k.value), rd(k.value*k.times)))
		}
	}
	var out []string
	out = append(out, alone...)
	if len(alone) == 0 {
		out = append(out, fmt.Sprintf("no single input closes the %v gap: %s; lower several of them",
			rd(gap), strings.Join(partial, ", ")))
	}
	out = append(out, fmt.Sprintf("or raise --slo to at least %v", rd(r.WorstTakeover)))
	if in.P99 >= in.SLO {
		out = append(out, fmt.Sprintf("the critical section alone (p99 %v) is not shorter than the SLO %v: no TTL can meet it; use a separate fast-fail path (a short heartbeat lease) or split the work", rd(in.P99), rd(in.SLO)))
	}
	return out
}

// rd rounds d for messages: to the millisecond from 1 ms up, else to the
// microsecond.
func rd(d time.Duration) time.Duration {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
