package pgstore

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/driver"
)

var _ driver.ConfigChecker = (*Store)(nil)

// CheckConfig implements driver.ConfigChecker with one query that needs
// no privilege beyond the store's: it warns (check "pg_durability") when the
// lock table is UNLOGGED while a standby streams (promoting it loses every
// lock), and, with Options.Durable, when the role commits with
// synchronous_commit off (a crash can lose acknowledged acquisitions).
func (s *Store) CheckConfig(ctx context.Context) ([]driver.ConfigWarning, error) {
	var persistence, syncCommit string
	var standbys int
	err := s.db.QueryRow(ctx, `SELECT coalesce((SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)), ''),
		(SELECT count(*) FROM pg_stat_replication), current_setting('synchronous_commit')`, s.n.locks).
		Scan(&persistence, &standbys, &syncCommit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: check settings: %w", err)
	}
	switch {
	case persistence == "u" && standbys > 0:
		return []driver.ConfigWarning{{Check: "pg_durability",
			Seen: fmt.Sprintf("%s is UNLOGGED and %d standby(s) stream from this server: promoting one loses every lock", s.n.locks, standbys),
			Fix:  fmt.Sprintf("ALTER TABLE %s SET LOGGED; ALTER TABLE %s SET LOGGED; and Durable: true", s.n.locks, s.n.waiters)}}, nil
	case persistence == "p" && s.opts.Durable && syncCommit == "off":
		return []driver.ConfigWarning{{Check: "pg_durability",
			Seen: "Durable, but the role commits with synchronous_commit off: a crash can lose acknowledged acquisitions",
			Fix:  "ALTER ROLE <the store's role> SET synchronous_commit = on;"}}, nil
	}
	return nil, nil
}
