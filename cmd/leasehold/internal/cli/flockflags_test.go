package cli

import (
	"testing"
	"time"
)

func TestSecondsOrDuration(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{"5", 5 * time.Second},
		{"0.5", 500 * time.Millisecond},
		{".007", 7 * time.Millisecond},
		{"0", 0},
		{"-1", -time.Second}, // run rejects it with a message naming --wait
		{"1m30s", 90 * time.Second},
		{"250ms", 250 * time.Millisecond},
	} {
		var d secondsOrDuration
		if err := d.Set(tt.in); err != nil || time.Duration(d) != tt.want {
			t.Errorf("Set(%q): expected %v, got %v (%v)", tt.in, tt.want, time.Duration(d), err)
		}
	}
	for _, bad := range []string{"", "soon", "5 s", "NaN", "inf", "1e300", "5x"} {
		var d secondsOrDuration
		if err := d.Set(bad); err == nil {
			t.Errorf("Set(%q): expected an error, got %v", bad, time.Duration(d))
		}
	}
}
