package drill

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
)

// On the drill's own PostgreSQL (a primary and a streaming standby, each
// behind a fault proxy), the safe configuration survives every fault: the
// restart (a crash with connections dropped mid-transaction; the UNLOGGED
// lock rows lost) and the failover (the primary crashed, the standby
// promoted) included. Fences never went backward or repeated, no stale
// write was accepted, and the leases in flight across the failover ended
// with a cause. LEASEHOLD_DRILL_FAILOVER_RUNS=N repeats it (docs/drill.md).
func TestPostgresSafeConfigurationPassesEveryFault(t *testing.T) {
	testpg.Bin(t) // fails with an install hint when PostgreSQL is missing
	t.Parallel()
	runs := 1
	if n := os.Getenv("LEASEHOLD_DRILL_FAILOVER_RUNS"); n != "" {
		runs = atoiOr(n, 1)
	}
	for range runs {
		rep, err := Run(t.Context(), Config{Store: StorePostgresServer, TTL: 500 * time.Millisecond,
			Faults: append(AllFaults[:len(AllFaults):len(AllFaults)], FaultFailover), Outage: 600 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		logReport(t, rep)
		checkPostgresRun(t, rep)
	}
}

func checkPostgresRun(t *testing.T, rep *Report) {
	t.Helper()
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold on PostgreSQL, failed: %+v", rep.Failed())
	}
	if len(rep.History.Windows) != len(AllFaults)+1 {
		t.Fatalf("expected %d fault windows, got %+v", len(AllFaults)+1, rep.History.Windows)
	}
	for _, w := range rep.History.Windows {
		if w.Skipped {
			t.Errorf("expected every fault injected on the drill's own PostgreSQL, %s was skipped: %s", w.Fault, w.Note)
		}
	}
	if len(rep.History.Restarts) != 1 || len(rep.History.Failovers) != 1 {
		t.Fatalf("expected one restart (lock rows lost) and one failover, got %v and %v", rep.History.Restarts, rep.History.Failovers)
	}
	if f := rep.History.Failovers[0]; f.End <= f.Start {
		t.Errorf("expected the promotion to take time, got %v–%v", f.Start, f.End)
	}
	fo := verdict(t, rep, "failover")
	if !strings.Contains(fo.Summary, "new master in place after") || !strings.Contains(fo.Summary, "leases in flight ended") {
		t.Errorf("expected the promotion's duration and the leases in flight in the report, got %q", fo.Summary)
	}
	if rejectedWrites(rep) == 0 {
		t.Errorf("expected the paused holder's stale write rejected, got none")
	}
	if rep.Events["store_error"] == 0 {
		t.Errorf("expected store errors from the outage, latency, lost replies, restart and failover, got none")
	}
}

// The election workload across a failover on PostgreSQL: leaders renew and
// the other replicas wait on the one key throughout; at most one leader is
// trusted outside the failover's window, terms' fences rise across it, and
// a leader is elected on the promoted standby.
func TestPostgresElectionFailover(t *testing.T) {
	testpg.Bin(t)
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: StorePostgresServer, Workload: WorkloadElection, TTL: 500 * time.Millisecond,
		Faults: []Fault{FaultPause, FaultFailover}})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if !rep.Passed {
		t.Fatalf("expected every invariant to hold, failed: %+v", rep.Failed())
	}
	if len(rep.History.Failovers) != 1 {
		t.Fatalf("expected one failover, got %v", rep.History.Failovers)
	}
	f := rep.History.Failovers[0]
	var after, held int
	for _, a := range rep.History.Acquisitions {
		if a.At > f.End {
			after++
		}
	}
	for _, s := range rep.History.Sections { // terms are back to back, but a new one may start just after the crash
		if s.Start <= f.Start && s.End >= f.Start-rep.Config.TTL {
			held++
		}
	}
	if after == 0 || held == 0 {
		t.Errorf("expected a leader up to the primary's crash and one elected on the promoted standby, got %d and %d (failover %v–%v)",
			held, after, f.Start, f.End)
	}
}

// Fencing off with a pause on an existing PostgreSQL (not the drill's): the
// paused holder's stale write lands and the checker fails the run; the
// restart and the failover are refused or skipped; the run drops its schema.
func TestPostgresUnsafeConfigurationFails(t *testing.T) {
	srv := testpg.Start(t)
	t.Parallel()
	dsn := srv.CreateDatabase(t)
	if _, err := (Config{Store: dsn, Faults: []Fault{FaultFailover}}).WithDefaults(); !errors.Is(err, ErrInvalidConfig) ||
		!strings.Contains(err.Error(), StorePostgresServer) {
		t.Errorf("expected the failover fault refused on an existing PostgreSQL, naming %s, got %v", StorePostgresServer, err)
	}
	rep, err := Run(t.Context(), Config{Store: dsn, TTL: 400 * time.Millisecond, Jobs: 12, NoFencing: true,
		Faults: []Fault{FaultPause, FaultRestart}})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if v := verdict(t, rep, "no stale write accepted").Verdict; v != Fail || rep.Passed {
		t.Errorf("expected a stale write accepted (FAIL) and the run failed, got %s", v)
	}
	sk := verdict(t, rep, "faults skipped")
	if sk.Verdict != Info || !strings.Contains(sk.Summary, "restart") || !strings.Contains(sk.Summary, "did not start") {
		t.Errorf("expected an INFO verdict saying the restart was skipped and why, got %s %q", sk.Verdict, sk.Summary)
	}
	var n int
	q := "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE 'leasehold_drill_%'"
	if err := testpg.Connect(t, dsn, pgxpool.New).QueryRow(t.Context(), q).Scan(&n); err != nil || n != 0 {
		t.Errorf("expected the drill to drop its schema, found %d (%v)", n, err)
	}
}

// Bad PostgreSQL settings are configuration errors that do not show the
// password; an unreachable server is a setup error.
func TestPostgresConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{Store: "postgres://app:hunter2@127.0.0.1:5432/db?migrate=perhaps"},
		{Store: "postgres://app:hunter2@127.0.0.1:notaport/db"},
		{Store: "postgres://app:hunter2@127.0.0.1:5432/db", Processes: true},
		{Store: StorePostgresServer, Processes: true},
	} {
		_, err := c.WithDefaults()
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s processes=%v: expected ErrInvalidConfig without the password, got %v", c.storeLabel(), c.Processes, err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	_, err = Run(t.Context(), Config{Store: fmt.Sprintf("postgres://app:hunter2@%s/db?connect_timeout=1", addr), Jobs: 3,
		OnStoreError: leasehold.FailClosed})
	if !errors.Is(err, ErrSetup) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("expected ErrSetup without the password, got %v", err)
	}
}

// The failover verdict says how the leases in flight ended, and fails when
// one ended with an error that is not a cause a holder can act on.
func TestCheckFailoverLeasesInFlight(t *testing.T) {
	h := History{
		Failovers: []Span{{Start: 50 * ms, End: 80 * ms}},
		Sections: []Section{
			{Replica: 0, Key: "a", Start: 0, End: 100 * ms, Outcome: "lost"},
			{Replica: 1, Key: "b", Start: 10 * ms, End: 200 * ms, Outcome: "written"},
			{Replica: 2, Key: "c", Start: 60 * ms, End: 90 * ms, Outcome: "pgstore: unexpected EOF"}, // after the start
		},
	}
	iv := checkFailovers(h)
	if iv.Verdict != Info || !strings.Contains(iv.Summary, "leases in flight ended: 1 lost, 1 written") {
		t.Errorf("expected INFO with 1 lost, 1 written in flight, got %s %q", iv.Verdict, iv.Summary)
	}
	h.Sections[1].Outcome = "pgstore: unexpected EOF"
	if iv := checkFailovers(h); iv.Verdict != Fail || len(iv.Details) != 1 || !strings.Contains(iv.Details[0], "replica 1") {
		t.Errorf("expected FAIL naming replica 1's lease, got %s %v", iv.Verdict, iv.Details)
	}
}
