package prommetrics

import (
	"fmt"
	"math"
	"regexp"
	"slices"
)

// DefaultNamespace prefixes every metric name: leasehold_acquire_wait_seconds.
const DefaultNamespace = "leasehold"

// DefaultMaxLockers is the default cap on distinct locker label values.
const DefaultMaxLockers = 64

// OverflowLocker is the locker label value used for every name past
// Options.MaxLockers, and OtherLabel the value used for an Op outside the
// known set.
const (
	OverflowLocker = "other"
	OtherLabel     = "other"
)

// DefaultWaitBuckets are the acquire wait and renew latency buckets, in
// seconds: 1 ms to 5 min.
var DefaultWaitBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300,
}

// DefaultHeldBuckets are the held duration buckets, in seconds: 1 ms to 1 h.
var DefaultHeldBuckets = []float64{
	0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
	1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
}

// Options configure an Observer. The zero value means the documented
// defaults; New copies the slices, so changing them afterwards has no effect.
type Options struct {
	// Namespace prefixes every metric name. Default "leasehold".
	Namespace string

	// ConstLabels are added to every series, e.g. {"service": "billing"}.
	// Default none. Must not use the label names the Observer sets itself.
	ConstLabels map[string]string

	// WaitBuckets of leasehold_acquire_wait_seconds, in seconds, strictly
	// increasing. Default DefaultWaitBuckets.
	WaitBuckets []float64

	// HeldBuckets of leasehold_held_seconds, in seconds, strictly
	// increasing. Default DefaultHeldBuckets.
	HeldBuckets []float64

	// RenewBuckets of leasehold_renew_seconds, in seconds, strictly
	// increasing. Default DefaultWaitBuckets.
	RenewBuckets []float64

	// MaxLockers caps the number of distinct locker label values, and apart
	// from them the number of distinct locker/resource pairs of stale writes.
	// Events of later names are counted under locker="other" (and
	// resource="other"), so a locker named after a key cannot explode the
	// series count. Default 64.
	MaxLockers int
}

var namespaceRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// reserved label names, set by the Observer.
var reserved = []string{"locker", "result", "reason", "op", "resource", "le"}

func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if !namespaceRE.MatchString(o.Namespace) {
		return o, fmt.Errorf("%w: Namespace %q is not a valid metric name prefix (letters, digits, '_', ':')", ErrInvalidOptions, o.Namespace)
	}
	for name := range o.ConstLabels {
		if slices.Contains(reserved, name) {
			return o, fmt.Errorf("%w: ConstLabels must not set %q: the Observer sets it", ErrInvalidOptions, name)
		}
	}
	var err error
	if o.WaitBuckets, err = buckets("WaitBuckets", o.WaitBuckets, DefaultWaitBuckets); err != nil {
		return o, err
	}
	if o.HeldBuckets, err = buckets("HeldBuckets", o.HeldBuckets, DefaultHeldBuckets); err != nil {
		return o, err
	}
	if o.RenewBuckets, err = buckets("RenewBuckets", o.RenewBuckets, DefaultWaitBuckets); err != nil {
		return o, err
	}
	switch {
	case o.MaxLockers < 0:
		return o, fmt.Errorf("%w: MaxLockers must be >= 1, got %d", ErrInvalidOptions, o.MaxLockers)
	case o.MaxLockers == 0:
		o.MaxLockers = DefaultMaxLockers
	}
	return o, nil
}

func buckets(field string, b, def []float64) ([]float64, error) {
	if len(b) == 0 {
		return slices.Clone(def), nil
	}
	for i, v := range b {
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			return nil, fmt.Errorf("%w: %s[%d] must be a finite number of seconds > 0, got %v", ErrInvalidOptions, field, i, v)
		}
		if i > 0 && v <= b[i-1] {
			return nil, fmt.Errorf("%w: %s must be strictly increasing, got %v after %v", ErrInvalidOptions, field, v, b[i-1])
		}
	}
	return slices.Clone(b), nil
}
