package calibrate

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LineError is a sample line that could not be read.
type LineError struct {
	Line int    // 1-based line number
	Text string // the line as read (trimmed, cut to 60 bytes)
	Err  error
}

// Error implements error.
func (e *LineError) Error() string {
	return fmt.Sprintf("line %d: %q: %v", e.Line, e.Text, e.Err)
}

// Unwrap returns ErrInput.
func (e *LineError) Unwrap() error { return ErrInput }

// maxLineErrors caps how many bad lines ParseSamples reports.
const maxLineErrors = 10

// ParseSamples reads held durations, one per line: a Go duration ("1.5s",
// "250ms") or a plain number of milliseconds ("250", "0.75"). Blank lines and
// lines starting with '#' are skipped. Every bad line is reported with its
// number (the first ten), joined into one error that wraps ErrInput; an input
// with no samples is an error too.
func ParseSamples(r io.Reader) ([]time.Duration, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var (
		out  []time.Duration
		errs []error
		bad  int
		n    int
	)
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		d, err := parseSample(line)
		if err != nil {
			bad++
			if bad <= maxLineErrors {
				text := line
				if len(text) > 60 {
					text = text[:60]
				}
				errs = append(errs, &LineError{Line: n, Text: text, Err: err})
			}
			continue
		}
		out = append(out, d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: reading samples after line %d: %v", ErrInput, n, err)
	}
	if bad > maxLineErrors {
		errs = append(errs, fmt.Errorf("%w: %d more bad lines", ErrInput, bad-maxLineErrors))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no samples (one duration per line, e.g. 1.5s or 1500 for milliseconds)", ErrInput)
	}
	return out, nil
}

func parseSample(s string) (time.Duration, error) {
	var d time.Duration
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f > float64(math.MaxInt64/int64(time.Millisecond)) {
			return 0, errors.New("not a usable number of milliseconds")
		}
		d = time.Duration(f * float64(time.Millisecond))
	} else {
		d, err = time.ParseDuration(s)
		if err != nil {
			return 0, errors.New("not a duration (want e.g. 1.5s, 250ms, or 250 for milliseconds)")
		}
	}
	if d < 0 {
		return 0, errors.New("negative duration")
	}
	return d, nil
}

// Percentile returns the p-th percentile (0 < p <= 100) of samples by the
// nearest-rank method: the smallest sample such that at least p% of the
// samples are less than or equal to it. samples is not modified. It returns 0
// for no samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// Summary describes a set of samples.
type Summary struct {
	Count         int
	P50, P99, Max time.Duration
}

// Summarize returns the count, median, p99 and maximum of samples.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return Summary{Count: len(s), P50: percentileSorted(s, 50), P99: percentileSorted(s, 99), Max: s[len(s)-1]}
}
