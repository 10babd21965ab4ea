package calibrate

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const s = time.Second

func TestCompute(t *testing.T) {
	tests := []struct {
		name                 string
		in                   Input
		ttl, renew, takeover time.Duration
		budgetOK             bool
		safeRenew            time.Duration
		safeMax              int
		verdict              Verdict
		slack                time.Duration
		adviceHas            []string
		warnHas              []string
	}{
		{
			// The seed's worked example: 18 s + 4 s + 2 s.
			name: "seed example meets 30s SLO",
			in:   Input{P99: 18 * s, Jitter: 4 * s, Guard: 2 * s, SLO: 30 * s},
			ttl:  24 * s, renew: 8 * s, takeover: 28 * s,
			// 8 s + 3 × 2 s + 2 × 10 ms = 14.02 s before the guard at
			// 24 s − 1.205 s: the library's defaults fit (the old formula,
			// 3 × 8 s + 2 s, flagged them as too large).
			budgetOK: true, safeRenew: 16775 * time.Millisecond, safeMax: 7,
			verdict: Meets, slack: 2 * s,
		},
		{
			name: "budget fits with two failures",
			in:   Input{P99: 18 * s, Jitter: 4 * s, Guard: 2 * s, MaxFailures: 2, RenewTimeout: s},
			ttl:  24 * s, renew: 8 * s, takeover: 28 * s,
			budgetOK: true, safeRenew: 20785 * time.Millisecond, safeMax: 14,
			verdict: NoSLO,
		},
		{
			name: "SLO impossible, p99 alone can fix it",
			in:   Input{P99: 50 * s, Jitter: 4 * s, Guard: 2 * s, SLO: 30 * s},
			ttl:  56 * s, renew: 56 * s / 3, takeover: 60 * s,
			budgetOK: true, safeRenew: 47175 * time.Millisecond, safeMax: 17,
			verdict: Impossible, slack: -30 * s,
			adviceHas: []string{"lower --p99 from 50s to at most 20s", "raise --slo to at least 1m0s", "p99 50s"},
		},
		{
			name: "SLO impossible, guard alone fixes a small gap",
			in:   Input{P99: 10 * s, Jitter: 2 * s, Guard: 5 * s, SLO: 18 * s},
			ttl:  17 * s, renew: 17 * s / 3, takeover: 19 * s,
			budgetOK: true, safeRenew: 10125 * time.Millisecond, safeMax: 5,
			verdict: Impossible, slack: -1 * s,
			adviceHas: []string{"lower --p99 from 10s to at most 9s", "lower --guard from 5s to at most 4s", "lower --jitter from 2s to at most 1.5s"},
		},
		{
			name: "no single input closes the gap",
			in:   Input{P99: 3 * s, Jitter: 3 * s, Guard: 3 * s, SLO: 5 * s},
			ttl:  9 * s, renew: 3 * s, takeover: 12 * s,
			// TTL 9 s: renew timeout (9 − 0.455 − 3 − 0.02) / 4 = 1.38125 s.
			budgetOK: true, safeRenew: 4381250 * time.Microsecond, safeMax: 3,
			verdict: Impossible, slack: -7 * s,
			adviceHas: []string{"no single input closes the 7s gap", "--jitter (3s) can give back at most 6s"},
		},
		{
			name: "explicit detection jitter",
			in:   Input{P99: 600 * time.Millisecond, Jitter: 100 * time.Millisecond, Guard: 300 * time.Millisecond, DetectionJitter: 50 * time.Millisecond, RenewTimeout: 100 * time.Millisecond, MaxFailures: 2, SLO: 2 * s},
			ttl:  s, renew: 333333333, takeover: 1050 * time.Millisecond,
			budgetOK: true, safeRenew: 735 * time.Millisecond, safeMax: 5,
			verdict: Meets, slack: 950 * time.Millisecond,
		},
		{
			name: "detection jitter is its own knob when given",
			in:   Input{P99: 10 * s, Jitter: 2 * s, Guard: 0, DetectionJitter: 3 * s, SLO: 14 * s},
			ttl:  12 * s, renew: 4 * s, takeover: 15 * s,
			budgetOK: true, safeRenew: 5843750 * time.Microsecond, safeMax: 3,
			verdict: Impossible, slack: -1 * s,
			adviceHas: []string{"lower --jitter from 2s to at most 1s", "lower --detection-jitter from 3s to at most 2s"},
		},
		{
			name: "renew timeout longer than TTL",
			in:   Input{P99: 500 * time.Millisecond, Jitter: 0, Guard: 0, RenewTimeout: 2 * s},
			ttl:  500 * time.Millisecond, renew: 166666666, takeover: 500 * time.Millisecond,
			budgetOK: false, safeRenew: 0, safeMax: 0,
			verdict: NoSLO,
			warnHas: []string{"lower --renew-timeout", "leaves no time before expiry"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Compute(tt.in)
			if err != nil {
				t.Fatalf("Compute: %v", err)
			}
			check := func(what string, got, want time.Duration) {
				t.Helper()
				if got != want {
					t.Errorf("%s: expected %v, got %v", what, want, got)
				}
			}
			check("TTL", r.TTL, tt.ttl)
			check("RenewInterval", r.RenewInterval, tt.renew)
			check("WorstTakeover", r.WorstTakeover, tt.takeover)
			check("SafeRenewInterval", r.SafeRenewInterval, tt.safeRenew)
			check("Slack", r.Slack, tt.slack)
			if r.BudgetOK != tt.budgetOK {
				t.Errorf("BudgetOK: expected %v, got %v (budget %v, headroom %v)", tt.budgetOK, r.BudgetOK, r.BudgetTime, r.BudgetHeadroom)
			}
			if r.BudgetHeadroom != r.TTL-r.DriftMargin-r.BudgetTime {
				t.Errorf("headroom %v != TTL %v - drift %v - budget %v", r.BudgetHeadroom, r.TTL, r.DriftMargin, r.BudgetTime)
			}
			if r.SafeMaxFailures != tt.safeMax {
				t.Errorf("SafeMaxFailures: expected %d, got %d", tt.safeMax, r.SafeMaxFailures)
			}
			if r.Verdict != tt.verdict {
				t.Errorf("Verdict: expected %s, got %s", tt.verdict, r.Verdict)
			}
			checkAdvice(t, r, tt.verdict, tt.adviceHas, tt.warnHas)
		})
	}
}

func checkAdvice(t *testing.T, r Result, verdict Verdict, adviceHas, warnHas []string) {
	t.Helper()
	if verdict == Impossible && len(r.Advice) == 0 {
		t.Errorf("impossible verdict without advice")
	}
	if verdict != Impossible && len(r.Advice) != 0 {
		t.Errorf("unexpected advice: %q", r.Advice)
	}
	all := strings.Join(r.Advice, "\n")
	for _, want := range adviceHas {
		if !strings.Contains(all, want) {
			t.Errorf("advice lacks %q:\n%s", want, all)
		}
	}
	warns := strings.Join(r.Warnings, "\n")
	for _, want := range warnHas {
		if !strings.Contains(warns, want) {
			t.Errorf("warnings lack %q:\n%s", want, warns)
		}
	}
}

// The safe values it recommends must themselves pass the budget rule, and
// be the largest that do.
func TestComputeRecommendationsFit(t *testing.T) {
	for _, p99 := range []time.Duration{200 * time.Millisecond, 3 * s, 18 * s, 55 * s} {
		for _, mf := range []int{1, 2, 3, 5, 20} {
			r, err := Compute(Input{P99: p99, Jitter: s, Guard: s, MaxFailures: mf, RenewTimeout: 2 * s})
			if err != nil {
				t.Fatal(err)
			}
			b := Budget{TTL: r.TTL, RenewInterval: r.RenewInterval, RenewTimeout: r.Input.RenewTimeout,
				DriftMargin: r.DriftMargin, MaxRenewFailures: mf}
			if r.SafeRenewInterval > 0 {
				at := b
				if at.RenewInterval = r.SafeRenewInterval; !at.Fits() {
					t.Errorf("p99 %v mf %d: safe interval %v does not fit", p99, mf, r.SafeRenewInterval)
				}
				if at.RenewInterval++; at.Fits() {
					t.Errorf("p99 %v mf %d: safe interval %v is not the longest", p99, mf, r.SafeRenewInterval)
				}
			}
			if r.SafeMaxFailures > 0 {
				at := b
				if at.MaxRenewFailures = r.SafeMaxFailures; !at.Fits() {
					t.Errorf("p99 %v: safe max failures %d does not fit", p99, r.SafeMaxFailures)
				}
				if at.MaxRenewFailures++; at.Fits() {
					t.Errorf("p99 %v: safe max failures %d is not the largest", p99, r.SafeMaxFailures)
				}
			}
		}
	}
}

func TestComputeRejectsBadInput(t *testing.T) {
	tests := []struct {
		in   Input
		want string
	}{
		{Input{}, "p99"},
		{Input{P99: -s}, "p99"},
		{Input{P99: s, Jitter: -1}, "jitter"},
		{Input{P99: s, Guard: -1}, "guard"},
		{Input{P99: s, SLO: -1}, "SLO"},
		{Input{P99: s, RenewTimeout: -1}, "renew timeout"},
		{Input{P99: s, MaxFailures: -1}, "max failures"},
		{Input{P99: s, DetectionJitter: -1}, "detection jitter"},
	}
	for _, tt := range tests {
		_, err := Compute(tt.in)
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Compute(%+v): expected an ErrInput naming %q, got %v", tt.in, tt.want, err)
		}
	}
}

func TestParseSamples(t *testing.T) {
	got, err := ParseSamples(strings.NewReader("# held durations\n250\n1.5s\n\n  0.5 \n2m\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{250 * time.Millisecond, 1500 * time.Millisecond, 500 * time.Microsecond, 2 * time.Minute}
	if len(got) != len(want) {
		t.Fatalf("expected %v, got %v", want, got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sample %d: expected %v, got %v", i, want[i], got[i])
		}
	}
}

func TestParseSamplesReportsLines(t *testing.T) {
	_, err := ParseSamples(strings.NewReader("100\nfast\n200\n-5\n1e400\n3x\n"))
	if !errors.Is(err, ErrInput) {
		t.Fatalf("expected ErrInput, got %v", err)
	}
	var lines []int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var le *LineError
		if errors.As(e, &le) {
			lines = append(lines, le.Line)
		}
	}
	if want := []int{2, 4, 5, 6}; len(lines) != len(want) || lines[0] != 2 || lines[1] != 4 || lines[2] != 5 || lines[3] != 6 {
		t.Errorf("expected bad lines %v, got %v (%v)", want, lines, err)
	}
	if !strings.Contains(err.Error(), `line 2: "fast"`) {
		t.Errorf("error does not name line 2: %v", err)
	}
}

func TestParseSamplesEmptyAndCapped(t *testing.T) {
	if _, err := ParseSamples(strings.NewReader("# nothing\n\n")); !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "no samples") {
		t.Errorf("expected no samples error, got %v", err)
	}
	_, err := ParseSamples(strings.NewReader(strings.Repeat("x\n", 25)))
	if err == nil || !strings.Contains(err.Error(), "15 more bad lines") || strings.Contains(err.Error(), "line 11:") {
		t.Errorf("expected ten line errors and a count of the rest, got %v", err)
	}
}

func TestPercentile(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{
		{50, 50 * time.Millisecond},
		{99, 99 * time.Millisecond},
		{99.9, 100 * time.Millisecond},
		{100, 100 * time.Millisecond},
		{0.1, 1 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Percentile(samples, tt.p); got != tt.want {
			t.Errorf("p%v: expected %v, got %v", tt.p, tt.want, got)
		}
	}
	if samples[0] != 100*time.Millisecond {
		t.Errorf("Percentile modified its input")
	}
	if got := Percentile(nil, 99); got != 0 {
		t.Errorf("empty: expected 0, got %v", got)
	}
	sum := Summarize([]time.Duration{3, 1, 2})
	if sum.Count != 3 || sum.P50 != 2 || sum.P99 != 3 || sum.Max != 3 {
		t.Errorf("Summarize: got %+v", sum)
	}
}

// Durations whose sum would overflow are refused, naming the input, instead
// of wrapping to a TTL of 0s that "meets" the SLO.
func TestHugeInputsAreRefused(t *testing.T) {
	_, err := Compute(Input{P99: 2562047*time.Hour + 47*time.Minute + 16*time.Second, Jitter: time.Second, Guard: time.Second, SLO: time.Hour})
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "p99") {
		t.Fatalf("expected ErrInput naming p99, got %v", err)
	}
	if _, err := Compute(Input{P99: time.Second, Jitter: MaxInput + 1}); !errors.Is(err, ErrInput) {
		t.Fatalf("expected ErrInput for a jitter over MaxInput, got %v", err)
	}
}
