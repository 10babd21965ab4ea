package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// doctor exits 1 on a FAIL and 0 once the fix it printed is applied;
// --json carries the same verdicts.
func TestDoctorRedisExitStatus(t *testing.T) {
	srv := testredis.Start(t, "--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru")
	if err := srv.Client(t).ConfigSet(t.Context(), "requirepass", "doctor-secret").Err(); err != nil {
		t.Fatal(err)
	}
	url := "redis://default:doctor-secret@" + srv.Addr
	code, out, errOut := runMain(t, "doctor", "--store", url)
	if code != ExitDoctorFailed || !strings.Contains(out, "FAIL  redis_eviction") || !strings.Contains(out, "Fix: CONFIG SET maxmemory-policy noeviction") {
		t.Fatalf("expected exit %d and the eviction FAIL with its fix, got %d\n%s%s", ExitDoctorFailed, code, out, errOut)
	}
	if strings.Contains(out+errOut, "doctor-secret") {
		t.Fatalf("expected no password in the output, got\n%s%s", out, errOut)
	}
	code, out, _ = runMain(t, "doctor", "--store", url, "--json")
	var report doctorJSON
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != ExitDoctorFailed || !report.Failed {
		t.Fatalf("expected a failed JSON report and exit %d, got %d, %v:\n%s", ExitDoctorFailed, code, err, out)
	}

	// Apply the fix as printed (the CONFIG SET before the parenthesis).
	fix := ""
	for _, r := range report.Checks {
		if r.Check == "redis_eviction" {
			fix, _, _ = strings.Cut(r.Fix, " (")
		}
	}
	admin := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, Password: "doctor-secret"})
	defer admin.Close()
	var args []any
	for _, f := range strings.Fields(fix) {
		args = append(args, f)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatalf("the fix %q does not run: %v", fix, err)
	}
	code, out, errOut = runMain(t, "doctor", "--store", url)
	if code != ExitOK || !strings.Contains(out, "OK    redis_eviction") {
		t.Fatalf("expected exit 0 after the fix, got %d\n%s%s", code, out, errOut)
	}
}

func TestDoctorUsageAndUnavailable(t *testing.T) {
	if code, _, errOut := runMain(t, "doctor", "--store", "memory"); code != ExitUsage {
		t.Fatalf("expected exit %d for the memory store, got %d: %s", ExitUsage, code, errOut)
	}
	port := testredis.FreePort(t)
	if code, _, errOut := runMain(t, "doctor", "--store", fmt.Sprintf("postgres://nobody@127.0.0.1:%d/x?connect_timeout=2", port)); code != ExitUnavailable {
		t.Fatalf("expected exit %d for an unreachable database, got %d: %s", ExitUnavailable, code, errOut)
	}
}

// PostgreSQL goes through a pool of its own: doctor creates no table.
func TestDoctorPostgresCreatesNothing(t *testing.T) {
	srv := testpg.Start(t)
	code, out, errOut := runMain(t, "doctor", "--store", srv.DSN())
	if code != ExitDoctorFailed || !strings.Contains(out, "FAIL  pg_lock_privileges") {
		t.Fatalf("expected the missing lock table to FAIL, got %d\n%s%s", code, out, errOut)
	}
	var n int
	if err := testpg.Connect(t, srv.DSN(), pgxpool.New).QueryRow(t.Context(), "SELECT count(*) FROM pg_class WHERE relname LIKE 'leasehold%'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("expected doctor to create nothing, got %d objects (%v)", n, err)
	}
}

// run's story of a lease lost to eviction names the cause and the fix.
func TestEndStoryEvicted(t *testing.T) {
	cause := fmt.Errorf("%w: %w", leasehold.ErrLeaseLost, fmt.Errorf("%w: %w", leasehold.ErrNotOwned, redisstore.ErrEvicted))
	if s := endStory(t.Context(), nil, "k", cause, 3); !strings.Contains(s, "evicted") || !strings.Contains(s, "noeviction") {
		t.Fatalf("expected the eviction and its fix, got %q", s)
	}
}
