-- Adds the fence column that package fence (github.com/leasehold/leasehold/fence)
-- checks on every write. Replace "jobs" with the table written under leases;
-- fence.MigrationSQL returns the same statement for any table, quoted.
--
-- Existing rows get fence 0, so the first fenced write to each row wins.
-- Safe to run twice. The table needs a primary key or unique constraint on
-- the id column for insert-if-absent writes (fence.Table.Write).
ALTER TABLE "jobs" ADD COLUMN IF NOT EXISTS "fence" bigint NOT NULL DEFAULT 0 CHECK ("fence" >= 0);
