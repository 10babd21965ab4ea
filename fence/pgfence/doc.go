// Package pgfence is a fenced PostgreSQL table: a fence.Resource whose rows
// carry a fence column, written with one conditional UPDATE or
// INSERT ... ON CONFLICT over pgx v5, inside the caller's transaction if it
// wants (Table.WithDB).
//
// It is its own module (github.com/leasehold/leasehold/fence/pgfence), so a
// program that fences Redis writes never builds pgx.
package pgfence
