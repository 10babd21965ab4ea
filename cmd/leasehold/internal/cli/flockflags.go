package cli

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// secondsOrDuration is a duration flag that also takes plain, possibly
// fractional, seconds as flock(1)'s -w does: "5", "0.5" and "1m30s" all work.
type secondsOrDuration time.Duration

// Set parses s as seconds, else as a Go duration.
func (d *secondsOrDuration) Set(s string) error {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		ns := secs * float64(time.Second)
		if math.IsNaN(ns) || math.Abs(ns) > math.MaxInt64 {
			return fmt.Errorf("want seconds (5, 0.5) or a duration (1m30s), got %q", s)
		}
		*d = secondsOrDuration(ns)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want seconds (5, 0.5) or a duration (1m30s), got %q", s)
	}
	*d = secondsOrDuration(v)
	return nil
}

// String prints the duration as Go does.
func (d *secondsOrDuration) String() string { return time.Duration(*d).String() }

// Type names the flag's value in the help.
func (d *secondsOrDuration) Type() string { return "duration" }
