package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
	"github.com/leasehold/leasehold/storetest"
)

// TestSemaphoreConformance runs the semaphore suite with every instance on
// its own pool over one database: separate replicas.
func TestSemaphoreConformance(t *testing.T) {
	srv := testpg.Start(t)
	dsn := srv.CreateDatabase(t)
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New:   func(t *testing.T) driver.Semaphorer { return open(t, dsn, pgstore.Options{}) },
		Break: func(t *testing.T, _ driver.Semaphorer) { cutOff(t, srv, dbName(t, dsn)) },
		Heal:  func(t *testing.T, _ driver.Semaphorer) { restore(t, srv, dbName(t, dsn)) },
	})
}

// TestSemaphoreNotMigrated: without the semaphore tables the error is a
// configuration error that names the fix.
func TestSemaphoreNotMigrated(t *testing.T) {
	srv := testpg.Start(t)
	dsn := srv.CreateDatabase(t)
	conn := testpg.Connect(t, dsn, pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, pgstore.MigrationSQL(pgstore.Options{})); err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn, pgstore.Options{Migrate: pgstore.MigrateNever})
	_, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: "k", Token: "a", TTL: time.Minute, Limit: 1})
	if !errors.Is(err, leasehold.ErrMisconfigured) {
		t.Fatalf("expected ErrMisconfigured, got %v", err)
	}
	if _, err := conn.Exec(ctx, pgstore.SemaphoreMigrationSQL("", "")); err != nil {
		t.Fatalf("SemaphoreMigrationSQL: %v", err)
	}
	if _, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: "k", Token: "a", TTL: time.Minute, Limit: 1}); err != nil {
		t.Fatalf("after the migration: %v", err)
	}
}
