// Package pgstore is the PostgreSQL lock store for leasehold, over pgx v5,
// for teams that run PostgreSQL and not Redis.
package pgstore
