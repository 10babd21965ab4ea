package drill

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testredis"
)

// testLogger sends the workers' stderr (forwarded by the drill) to the test
// log, so a failing worker explains itself.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// requireReaped fails unless every worker process of the run is gone: no
// process with its pid exists any more (signal 0 finds nothing).
func requireReaped(t *testing.T, h History) {
	t.Helper()
	if len(h.Workers) == 0 {
		t.Fatal("expected worker processes in the history, got none")
	}
	for _, w := range h.Workers {
		if w.PID <= 0 {
			t.Errorf("expected a pid for replica %d #%d, got %d", w.Replica, w.Incarnation, w.PID)
			continue
		}
		if err := syscall.Kill(w.PID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("expected worker pid %d (replica %d #%d, %s) gone, kill(pid, 0) = %v", w.PID, w.Replica, w.Incarnation, w.Exit, err)
		}
	}
}

// Replicas as processes against the drill's own redis-server: the safe
// configuration holds every invariant under a SIGSTOP pause, a proxy outage,
// a SIGKILL crash and the rest; the paused process's write is rejected; the
// killed one is restarted as a new process; no process outlives the run.
func TestProcessesSafeConfiguration(t *testing.T) {
	testredis.Binary(t)
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: StoreRedisServer, Processes: true, TTL: 400 * time.Millisecond,
		Faults: AllFaults, Outage: 600 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	requireReaped(t, rep.History)
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold with worker processes, failed: %+v", rep.Failed())
	}
	if !rep.Config.Processes {
		t.Error("expected the report to say the replicas were processes")
	}
	stops, crashed, restarted := 0, 0, 0
	for _, w := range rep.History.Workers {
		stops += w.Stops
		if w.Exit == "killed (crash)" {
			crashed++
		}
		if w.Incarnation > 0 {
			restarted++
		}
	}
	if stops != 1 || crashed != 1 || restarted != 1 {
		t.Errorf("expected 1 SIGSTOP, 1 SIGKILL and 1 restarted process, got %d, %d, %d: %+v", stops, crashed, restarted, rep.History.Workers)
	}
	pausedRejected := false
	for _, o := range rep.History.Ops {
		if o.Write && !o.Accepted && rep.History.Sections[o.Section].PauseStart > 0 {
			pausedRejected = true
			if o.Call < rep.History.Sections[o.Section].PauseEnd {
				t.Errorf("expected the paused process to write after its SIGCONT, wrote at %v (pause ended %v)", o.Call, rep.History.Sections[o.Section].PauseEnd)
			}
		}
	}
	if !pausedRejected {
		t.Error("expected the paused process's write rejected as stale, got none")
	}
	if len(rep.Takeovers) < 2 {
		t.Errorf("expected takeovers after the pause and the crash, got %+v", rep.Takeovers)
	}
	if rep.Events["acquire"] == 0 || rep.Events["stale_write"] == 0 {
		t.Errorf("expected the workers' locker events and the register's stale write counted, got %v", rep.Events)
	}
}

// Fencing off: the paused process wakes and its stale write lands; the
// checker fails the run.
func TestProcessesUnsafeConfigurationFails(t *testing.T) {
	testredis.Binary(t)
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: StoreRedisServer, Processes: true, TTL: 300 * time.Millisecond, Jobs: 16,
		NoFencing: true, Faults: []Fault{FaultPause}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	requireReaped(t, rep.History)
	if v := verdict(t, rep, "no stale write accepted").Verdict; v != Fail {
		t.Errorf("expected the paused process's stale write accepted (FAIL), got %s", v)
	}
	if rep.Passed {
		t.Error("expected the run to fail")
	}
}

// --processes with the memory store is refused: the store lives in one
// process.
func TestProcessesNeedRedis(t *testing.T) {
	_, err := Config{Processes: true}.WithDefaults()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--store redis-server") {
		t.Errorf("expected ErrInvalidConfig naming --store redis-server, got %v", err)
	}
	out, err := runCommand(t, "--processes", "--faults", "pause", "--jobs", "4")
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "memory store") {
		t.Errorf("expected the command to refuse --processes on memory, got %v\n%s", err, out)
	}
}

// Cancelling the drill's context while a worker process is SIGSTOPped (the
// pause fault) stops and reaps every worker process. Not parallel: it
// watches for a stopped child of this test process in /proc.
func TestProcessesCancelReapsWorkers(t *testing.T) {
	testredis.Binary(t)
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see a stopped worker")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		cancelledStopped atomic.Bool
		wg               sync.WaitGroup
	)
	wg.Go(func() {
		deadline := time.Now().Add(20 * time.Second)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			if stoppedChild() {
				cancelledStopped.Store(true)
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	})
	defer wg.Wait()
	start := time.Now()
	rep, err := Run(ctx, Config{Store: StoreRedisServer, Processes: true, TTL: 300 * time.Millisecond, Faults: []Fault{FaultPause, FaultCrash}})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if !cancelledStopped.Load() {
		t.Fatal("expected to see a SIGSTOPped worker process and cancel then, saw none")
	}
	if took > 15*time.Second {
		t.Errorf("expected Run to return soon after the cancel, took %v", took)
	}
	requireReaped(t, rep.History)
	stops := 0
	for _, w := range rep.History.Workers {
		stops += w.Stops
		if w.Exit != "stopped" {
			t.Errorf("expected every worker to stop when told, replica %d #%d: %s", w.Replica, w.Incarnation, w.Exit)
		}
	}
	if stops != 1 {
		t.Errorf("expected the cancel to land during the one SIGSTOP, got %d", stops)
	}
}

// stoppedChild reports whether a child of this process is stopped (state T
// in /proc/PID/stat).
func stoppedChild() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	me := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[0] == "T" && f[1] == me {
			return true
		}
	}
	return false
}

// A worker command that does not speak the protocol is a setup error that
// names the worker, not a report.
func TestProcessesBrokenWorker(t *testing.T) {
	testredis.Binary(t)
	_, err := Run(t.Context(), Config{Store: StoreRedisServer, Processes: true, Jobs: 3, Faults: []Fault{FaultPause},
		WorkerCommand: []string{"sh", "-c", "echo worker is broken >&2; exit 3"}})
	if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "worker is broken") {
		t.Errorf("expected ErrSetup quoting the worker's stderr, got %v", err)
	}
}

// The hidden worker subcommand refuses to run without its settings.
func TestWorkerCommandNeedsSettings(t *testing.T) {
	cmd := Command()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader("not json"))
	cmd.SetArgs([]string{"worker"})
	if err := cmd.ExecuteContext(t.Context()); err == nil || !strings.Contains(err.Error(), "settings") {
		t.Errorf("expected the worker to refuse input that is not its settings, got %v", err)
	}
	if u := Command().UsageString(); strings.Contains(u, "Available Commands") || strings.Contains(u, "worker  ") {
		t.Error("expected the worker subcommand hidden from the drill's usage")
	}
}
