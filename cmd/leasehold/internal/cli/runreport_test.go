package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// textfileValues reads a textfile collector file into "name{labels}" ->
// value, and checks it with promtool check metrics.
func textfileValues(t *testing.T, file string) map[string]float64 {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("%s is not in the text format: %v\n%s", file, err, raw)
	}
	var list []*dto.MetricFamily
	for _, f := range fams {
		list = append(list, f)
	}
	vec, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{Timestamp: model.Now()}, list...)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	for _, s := range vec {
		delete(s.Metric, "command")
		out[s.Metric.String()] = float64(s.Value)
	}
	cmd := exec.CommandContext(t.Context(), needTool(t, "promtool"), "check", "metrics")
	cmd.Stdin = strings.NewReader(string(raw))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s: %v\n%s", file, err, b)
	}
	return out
}

func TestRunMetricsTextfile(t *testing.T) {
	srv := testredis.Start(t)
	dir := t.TempDir()
	store := "--store=" + srv.URL()
	file := filepath.Join(dir, "leasehold_run_nightly.prom")

	read := func(t *testing.T, wantCode int, outcome string) map[string]float64 {
		t.Helper()
		v := textfileValues(t, file)
		if got := v[`leasehold_run_last_exit_code{locker="nightly"}`]; got != float64(wantCode) {
			t.Errorf("exit code %v in the textfile, want %d", got, wantCode)
		}
		for _, o := range runOutcomes {
			want := 0.0
			if o == outcome {
				want = 1
			}
			if got, ok := v[`leasehold_run_last_outcome{locker="nightly", outcome="`+o+`"}`]; !ok || got != want {
				t.Errorf("outcome %s = %v (present %v), want %v", o, got, ok, want)
			}
		}
		if end := v[`leasehold_run_last_end_timestamp_seconds{locker="nightly"}`]; time.Since(time.Unix(int64(end), 0)) > time.Minute {
			t.Errorf("end timestamp %v is not recent", end)
		}
		return v
	}

	t.Run("ok", func(t *testing.T) {
		code, _, errOut := runMain(t, store, "run", "--key", "nightly", "--name", "nightly", "--metrics-textfile", dir, "--", "sleep", "0.2")
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		v := read(t, 0, "ok")
		if held := v[`leasehold_run_last_held_seconds{locker="nightly"}`]; held < 0.2 || held > 30 {
			t.Errorf("held %vs, want about 0.2s", held)
		}
		if n := v[`leasehold_held_seconds_count{locker="nightly", reason="released"}`]; n != 1 {
			t.Errorf("expected the lease metrics too (one released lease), got %v", n)
		}
		if _, ok := v[`leasehold_stale_writes_rejected_total{locker="nightly"}`]; ok {
			t.Errorf("unexpected stale-write series")
		}
		for k := range v {
			if strings.HasPrefix(k, "go_") || strings.HasPrefix(k, "process_") {
				t.Fatalf("the textfile must not carry %s: node_exporter has its own", k)
			}
		}
	})
	t.Run("child failed", func(t *testing.T) {
		code, _, _ := runMain(t, store, "run", "--key", "nightly", "--name", "nightly", "--metrics-textfile", dir, "--", "sh", "-c", "exit 3")
		if code != 3 {
			t.Fatalf("exit %d, want 3", code)
		}
		read(t, 3, "failed")
	})
	t.Run("lost at max hold", func(t *testing.T) {
		code, _, _ := runMain(t, store, "run", "--key", "nightly", "--name", "nightly", "--max-hold", "300ms", "--grace", "100ms", "--metrics-textfile", dir, "--", "sleep", "10")
		if code != ExitLeaseLost {
			t.Fatalf("exit %d, want %d", code, ExitLeaseLost)
		}
		v := read(t, ExitLeaseLost, "lost")
		if held := v[`leasehold_run_last_held_seconds{locker="nightly"}`]; held < 0.25 || held > 5 {
			t.Errorf("held %vs, want about the 300ms max hold", held)
		}
	})
	t.Run("not acquired", func(t *testing.T) {
		rs, err := redisstore.New(srv.Client(t), redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := leasehold.New(rs, leasehold.Options{Name: "other"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		held, err := l.TryAcquire(t.Context(), "nightly")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = held.Release(t.Context()) }()
		code, _, _ := runMain(t, store, "run", "--key", "nightly", "--name", "nightly", "--metrics-textfile", dir, "--", "true")
		if code != ExitNotAcquired {
			t.Fatalf("exit %d, want %d", code, ExitNotAcquired)
		}
		v := read(t, ExitNotAcquired, "not_acquired")
		if held := v[`leasehold_run_last_held_seconds{locker="nightly"}`]; held != 0 {
			t.Errorf("held %v, want 0", held)
		}
	})
	t.Run("not a directory", func(t *testing.T) {
		code, _, errOut := runMain(t, store, "run", "--key", "nightly", "--metrics-textfile", filepath.Join(dir, "nope"), "--", "true")
		if code != ExitUsage || !strings.Contains(errOut, "not a directory") {
			t.Fatalf("exit %d, want %d with 'not a directory': %s", code, ExitUsage, errOut)
		}
	})
	// Written by rename: no temporary file is left behind.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("expected only leasehold_run_nightly.prom in the directory, got %v", entries)
	}
}

func TestRunPush(t *testing.T) {
	srv := testredis.Start(t)
	var (
		mu     sync.Mutex
		method string
		path   string
		body   string
	)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		method, path, body = r.Method, r.URL.Path, string(b)
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer gw.Close()
	code, _, errOut := runMain(t, "--store="+srv.URL(), "run", "--key", "k", "--name", "backup", "--push", gw.URL, "--", "sh", "-c", "exit 4")
	if code != 4 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if method != http.MethodPut || path != "/metrics/job/leasehold_run/run/backup" {
		t.Errorf("expected PUT /metrics/job/leasehold_run/run/backup, got %s %s", method, path)
	}
	// The body is the protobuf delimited format by default; the names are
	// in it as plain strings.
	for _, want := range []string{"leasehold_run_last_exit_code", "leasehold_run_last_outcome", "leasehold_run_last_held_seconds", "leasehold_acquire_wait_seconds"} {
		if !strings.Contains(body, want) {
			t.Errorf("pushed body lacks %s", want)
		}
	}
	// An unreachable gateway is a warning; run's status is the command's.
	code, _, errOut = runMain(t, "--store="+srv.URL(), "run", "--key", "k", "--push", "http://127.0.0.1:1", "--", "true")
	if code != ExitOK || !strings.Contains(errOut, "--push") {
		t.Errorf("expected exit 0 and a --push warning, got %d: %s", code, errOut)
	}
}

// The command's own status is never taken for run's: a command that ran
// under its lease and exited 2, 69, 75 or 79 (grep's error, sysexits, a
// nested run that found its key busy) failed; run did not lose its lease.
// And a conflict with -E 0 is not_acquired in the textfile as in --json.
func TestRunOutcomeOfTheCommandsStatus(t *testing.T) {
	srv := testredis.Start(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "leasehold_run_run.prom")
	check := func(t *testing.T, stdout, want string) {
		t.Helper()
		var res runResult
		if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Outcome != want {
			t.Errorf("--json: expected outcome %s, got %+v (%v)", want, res, err)
		}
		v := textfileValues(t, file)
		if got := v[`leasehold_run_last_outcome{locker="run", outcome="`+want+`"}`]; got != 1 {
			t.Errorf("textfile: expected outcome %s, got %v", want, grepValues(v, "leasehold_run_last_outcome"))
		}
	}
	for _, status := range []int{ExitUsage, ExitUnavailable, ExitNotAcquired, ExitLeaseLost} {
		code, stdout, stderr := runMain(t, "--store="+srv.URL(), "--json", "run", "--key", "own", "--metrics-textfile", dir, "--", "sh", "-c", "exit "+strconv.Itoa(status))
		if code != status {
			t.Fatalf("exit %d, want the command's %d: %s", code, status, stderr)
		}
		check(t, stdout, "failed")
	}

	l, err := leasehold.New(mustRedisStore(t, srv), leasehold.Options{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held, err := l.TryAcquire(t.Context(), "own")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Release(t.Context()) }()
	code, stdout, stderr := runMain(t, "--store="+srv.URL(), "--json", "run", "--key", "own", "-n", "-E", "0", "--metrics-textfile", dir, "--", "true")
	if code != 0 {
		t.Fatalf("exit %d, want 0 (-E 0): %s", code, stderr)
	}
	check(t, stdout, "not_acquired")
}

func mustRedisStore(t *testing.T, srv *testredis.Server) *redisstore.Store {
	t.Helper()
	rs, err := redisstore.New(srv.Client(t), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// grepValues returns the entries of v whose names start with prefix.
func grepValues(v map[string]float64, prefix string) map[string]float64 {
	out := map[string]float64{}
	for k, x := range v {
		if strings.HasPrefix(k, prefix) {
			out[k] = x
		}
	}
	return out
}
