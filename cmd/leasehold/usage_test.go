package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/testredis"
)

// Every bad input exits 2 with a message naming what to fix, and no panic.
func TestBadInputExits2(t *testing.T) {
	dir := t.TempDir()
	badSamples := filepath.Join(dir, "samples")
	if err := os.WriteFile(badSamples, []byte("100\nfast\n200\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	redisEnv := []string{"LEASEHOLD_STORE=redis://127.0.0.1:1"} // never dialled: input is checked first
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown flag", redisEnv, []string{"run", "--bogus", "--key", "k", "--", "true"}, "unknown flag: --bogus"},
		{"unknown command", nil, []string{"frobnicate"}, "unknown command"},
		{"missing key", redisEnv, []string{"run", "--", "true"}, "missing --key"},
		{"empty key", redisEnv, []string{"run", "--key", "", "--", "true"}, "key is empty"},
		{"bad duration", redisEnv, []string{"run", "--key", "k", "--ttl", "abc", "--", "true"}, `invalid argument "abc" for "--ttl"`},
		{"ttl zero", redisEnv, []string{"run", "--key", "k", "--ttl", "0", "--", "true"}, "--ttl must be > 0"},
		{"renew not below ttl", redisEnv, []string{"run", "--key", "k", "--ttl", "1s", "--renew-every", "1s", "--", "true"}, "--renew-every (1s) must be shorter than --ttl (1s)"},
		{"zero failures", redisEnv, []string{"run", "--key", "k", "--max-renew-failures", "0", "--", "true"}, "--max-renew-failures must be >= 1"},
		{"bad policy", redisEnv, []string{"run", "--key", "k", "--on-store-error", "maybe", "--", "true"}, "fail-closed or fail-open"},
		{"command twice", redisEnv, []string{"run", "--key", "k", "-c", "true", "--", "true"}, "either after -- or with -c"},
		{"args before dash", redisEnv, []string{"run", "--key", "k", "echo", "--", "hi"}, "put the whole command after --"},
		{"no store", nil, []string{"run", "--key", "k", "--", "true"}, "no store"},
		{"malformed URL", nil, []string{"--store", "redis://app:s3cretpw@host:notaport", "run", "--key", "k", "--", "true"}, "port"},
		{"unknown scheme", nil, []string{"inspect", "k", "--store", "mysql://db:3306"}, `unknown scheme "mysql"`},
		{"memory for run", nil, []string{"run", "--store", "memory", "--key", "k", "--", "true"}, "memory store lives inside one process"},
		{"memory for inspect", []string{"LEASEHOLD_STORE=memory"}, []string{"inspect", "k"}, "memory store"},
		{"memory for ls", []string{"LEASEHOLD_STORE=memory"}, []string{"ls"}, "memory store"},
		{"memory for release", []string{"LEASEHOLD_STORE=memory"}, []string{"release", "k", "--force"}, "memory store"},
		{"inspect without key", redisEnv, []string{"inspect"}, "takes one KEY"},
		{"release without token", redisEnv, []string{"release", "k"}, "missing --token"},
		{"release token and force", redisEnv, []string{"release", "k", "--token", "t", "--force"}, "not both"},
		{"calibrate missing jitter", nil, []string{"calibrate", "--p99", "1s", "--guard", "1s"}, "missing --jitter"},
		{"calibrate p99 and samples", nil, []string{"calibrate", "--p99", "1s", "--samples", badSamples, "--jitter", "0s", "--guard", "0s"}, "not both"},
		{"calibrate bad samples", nil, []string{"calibrate", "--samples", badSamples, "--jitter", "1s", "--guard", "1s"}, `line 2: "fast"`},
		{"calibrate missing samples file", nil, []string{"calibrate", "--samples", filepath.Join(dir, "nope"), "--jitter", "1s", "--guard", "1s"}, "no such file"},
		{"calibrate negative", nil, []string{"calibrate", "--p99", "-1s", "--jitter", "1s", "--guard", "1s"}, "p99"},
		{"bench concurrency", nil, []string{"bench", "--store", "memory", "--concurrency", "1,x"}, `"x" is not a number`},
		{"bench duration", nil, []string{"bench", "--store", "memory", "--duration", "0s"}, "--duration must be > 0"},
		{"bench metrics addr", nil, []string{"bench", "--store", "memory", "--metrics-addr", "not-an-address"}, "--metrics-addr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := lh(t, tt.env, tt.args...)
			if code != 2 {
				t.Errorf("expected exit 2, got %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("expected stderr to contain %q, got:\n%s", tt.want, stderr)
			}
			if strings.Contains(stdout+stderr, "s3cretpw") {
				t.Errorf("output leaks the password:\n%s%s", stdout, stderr)
			}
			noPanic(t, stdout, stderr)
		})
	}
}

// A password in the store URL never shows, also when the store rejects it.
func TestPasswordNeverPrinted(t *testing.T) {
	const pw = "Sup3rSecretPw"
	srv := testredis.Start(t, "--requirepass", "another-one")
	env := []string{"LEASEHOLD_STORE=redis://default:" + pw + "@" + srv.Addr}
	for _, args := range [][]string{
		{"run", "--key", "k", "--", "true"},
		{"run", "--key", "k", "--on-store-error", "fail-open", "-v", "--", "true"},
		{"inspect", "k"},
		{"ls", "--json"},
		{"release", "k", "--force"},
		{"bench", "--duration", "200ms", "--concurrency", "1", "--waiters", "2"},
	} {
		code, stdout, stderr := lh(t, env, args...)
		if code == 0 && args[0] != "run" {
			t.Errorf("%v: expected a failure with a wrong password, got 0", args)
		}
		if strings.Contains(stdout+stderr, pw) {
			t.Errorf("%v: output leaks the password:\n%s%s", args, stdout, stderr)
		}
		if !strings.Contains(stdout+stderr, "xxxxx") && code != 0 {
			t.Errorf("%v: expected the redacted URL in the message, got:\n%s", args, stderr)
		}
	}
}

func TestHelpDocumentsEverything(t *testing.T) {
	for cmd, wants := range map[string][]string{
		"run":       {"--key", "--ttl", "--wait", "--renew-every", "--max-renew-failures", "--on-store-error", "--grace", "--metrics-addr", "LEASEHOLD_KEY", "LEASEHOLD_TOKEN", "LEASEHOLD_FENCE", "LEASEHOLD_DEGRADED", "75", "69", "77", "78", "79", "--store", "--json"},
		"inspect":   {"remaining_ms", "facts", "token", "fence", "69", "77", "78"},
		"ls":        {"remaining_ms", "PREFIX", "69", "77", "78"},
		"release":   {"--token", "--force", "lock not owned", "69", "77", "78"},
		"calibrate": {"--p99", "--jitter", "--guard", "--slo", "--samples", "--renew-timeout", "--max-failures", "worst_takeover_ms", "verdict"},
		"bench":     {"--duration", "--concurrency", "--waiters", "cycles_per_sec", "handoff"},
	} {
		code, stdout, stderr := lh(t, nil, "help", cmd)
		if code != 0 {
			t.Errorf("help %s: exit %d: %s", cmd, code, stderr)
		}
		for _, w := range wants {
			if !strings.Contains(stdout, w) {
				t.Errorf("help %s does not mention %q", cmd, w)
			}
		}
	}
	code, stdout, _ := lh(t, nil, "--help")
	if code != 0 || !strings.Contains(stdout, "LEASEHOLD_STORE") || !strings.Contains(stdout, "Exit statuses") {
		t.Errorf("leasehold --help: got %d\n%s", code, stdout)
	}
}

func TestCalibrateOutput(t *testing.T) {
	code, stdout, stderr := lh(t, nil, "calibrate", "--p99", "18s", "--jitter", "4s", "--guard", "2s", "--slo", "30s", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if r["ttl_ms"] != 24000.0 || r["renew_interval_ms"] != 8000.0 || r["worst_takeover_ms"] != 28000.0 || r["verdict"] != "meets_slo" {
		t.Errorf("unexpected calibration: %s", stdout)
	}
	code, stdout, _ = lh(t, nil, "calibrate", "--p99", "50s", "--jitter", "4s", "--guard", "2s", "--slo", "30s")
	if code != 1 || !strings.Contains(stdout, "IMPOSSIBLE") || !strings.Contains(stdout, "lower --p99 from 50s to at most 20s") {
		t.Errorf("impossible SLO: expected exit 1 and advice naming --p99, got %d\n%s", code, stdout)
	}
	samples := filepath.Join(t.TempDir(), "held")
	var b strings.Builder
	for i := 1; i <= 100; i++ {
		b.WriteString(strconv.Itoa(i*10) + "\n") // 10 ms … 1000 ms
	}
	if err := os.WriteFile(samples, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = lh(t, nil, "calibrate", "--samples", samples, "--jitter", "10ms", "--guard", "0s", "--json")
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != 0 {
		t.Fatalf("samples: %d %v %s", code, err, stderr)
	}
	if s, _ := r["samples"].(map[string]any); s["count"] != 100.0 || s["p99_ms"] != 990.0 || r["ttl_ms"] != 1000.0 {
		t.Errorf("samples: expected 100 samples, p99 990ms, ttl 1000ms, got %s", stdout)
	}
}

func TestBench(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			url := store
			if store == "redis" {
				url = testredis.Start(t).URL()
			}
			code, stdout, stderr := lh(t, nil, "bench", "--store", url, "--duration", "300ms", "--concurrency", "1,4", "--waiters", "3", "--json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var b struct {
				Cycles []struct {
					Concurrency int     `json:"concurrency"`
					Cycles      int     `json:"cycles"`
					Errors      int     `json:"errors"`
					PerSecond   float64 `json:"cycles_per_sec"`
					Acquire     struct {
						P50 float64 `json:"p50_ms"`
						P99 float64 `json:"p99_ms"`
					} `json:"acquire"`
				} `json:"acquire_release"`
				Handoff struct {
					Waiters  int `json:"waiters"`
					Handoffs int `json:"handoffs"`
					Errors   int `json:"errors"`
					Latency  struct {
						P50 float64 `json:"p50_ms"`
					} `json:"latency"`
				} `json:"handoff"`
			}
			if err := json.Unmarshal([]byte(stdout), &b); err != nil {
				t.Fatalf("%v\n%s", err, stdout)
			}
			if len(b.Cycles) != 2 || b.Cycles[0].Concurrency != 1 || b.Cycles[1].Concurrency != 4 {
				t.Fatalf("expected two levels 1 and 4, got %s", stdout)
			}
			for _, c := range b.Cycles {
				if c.Cycles == 0 || c.Errors != 0 || c.PerSecond <= 0 || c.Acquire.P50 <= 0 || c.Acquire.P99 < c.Acquire.P50 {
					t.Errorf("implausible level: %+v", c)
				}
			}
			if b.Handoff.Waiters != 3 || b.Handoff.Handoffs == 0 || b.Handoff.Errors != 0 || b.Handoff.Latency.P50 <= 0 {
				t.Errorf("implausible hand-off: %+v", b.Handoff)
			}
			if !strings.Contains(stderr, "bench:") {
				t.Errorf("no progress on stderr: %q", stderr)
			}
		})
	}
}
