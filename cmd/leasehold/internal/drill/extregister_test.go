package drill

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/internal/testredis"
)

// The register can live in a real Redis or PostgreSQL (redisfence.NewRedis,
// pgfence.NewTable): the paused holder's stale write is rejected there, every
// invariant holds, and the run's keys or table are gone afterwards.
func TestExternalRegisters(t *testing.T) {
	pg := testpg.Start(t)
	rs := testredis.Start(t)
	for name, url := range map[string]string{"redis": rs.URL(), "postgres": pg.DSN()} {
		t.Run(name, func(t *testing.T) {
			// The pause is timing-dependent (the victim must reach its write
			// while another replica takes the job over): up to three runs
			// for one in which it bit; every run must pass.
			var rep *Report
			for attempt := 1; attempt <= 3; attempt++ {
				var err error
				rep, err = Run(t.Context(), Config{
					Register: url, TTL: 300 * time.Millisecond, Jobs: 16,
					Faults: []Fault{FaultPause, FaultOutage, FaultCrash}, Outage: 400 * time.Millisecond,
				})
				if err != nil {
					t.Fatal(err)
				}
				logReport(t, rep)
				if !rep.Passed {
					t.Fatalf("expected every invariant to hold with the register in %s, failed: %+v", name, rep.Failed())
				}
				rejected := 0
				for _, o := range rep.History.Ops {
					if o.Write && !o.Accepted && o.Err == "" {
						rejected++
					}
					if o.Err != "" {
						t.Errorf("expected no register errors, got %s", o.Err)
					}
				}
				if rejected > 0 {
					break
				}
				if attempt == 3 {
					t.Errorf("expected the %s register to reject the paused holder's stale write in one of 3 runs", name)
				}
			}
			if rep.Config.Register == "memory" {
				t.Errorf("expected the report to name the %s register", name)
			}
		})
	}
	ctx := context.Background()
	if keys, err := rs.Client(t).Keys(ctx, "leasehold-drill-register:*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("expected the runs' register keys removed from Redis, got %v, %v", keys, err)
	}
	var tables int
	if err := testpg.Connect(t, pg.DSN(), pgxpool.New).QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'leasehold_drill_register_%'").Scan(&tables); err != nil || tables != 0 {
		t.Errorf("expected the runs' register tables dropped, got %d, %v", tables, err)
	}
}

func TestRegisterConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Register: "mysql://x"}, "--register must be memory"},
		{Config{Register: "redis://:hunter2@127.0.0.1:6379/notadb"}, "--register"},
		{Config{Register: "redis://127.0.0.1:6379", NoFencing: true}, "--fencing off uses the drill's own unfenced register"},
	} {
		_, err := c.cfg.WithDefaults()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: expected ErrInvalidConfig mentioning %q without the password, got %v", c.cfg.Register, c.want, err)
		}
	}
	dead := testredis.FreePort(t)
	_, err := Run(t.Context(), Config{Register: "redis://:hunter2@127.0.0.1:" + strconv.Itoa(dead), Jobs: 2})
	if !errors.Is(err, ErrSetup) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("unreachable register: expected ErrSetup without the password, got %v", err)
	}
}

// A URL parse error quotes the URL escaped (%q), which hides a password with
// quotes or backslashes from a plain search: it must still not be printed.
func TestParseErrorsNeverPrintPasswords(t *testing.T) {
	const pass = `se"cr\et`
	for _, c := range []Config{
		{Store: "redis://:" + pass + "@127.0.0.1:bad port"},
		{Register: "redis://:" + pass + "@127.0.0.1:bad port"},
	} {
		_, err := c.WithDefaults()
		if err == nil {
			t.Fatalf("%+v: expected an error", c)
		}
		for _, leak := range []string{pass, `se\"cr\\et`, "cr"} {
			if strings.Contains(err.Error(), leak) {
				t.Fatalf("expected no trace of the password in %q (found %q)", err, leak)
			}
		}
	}
}
