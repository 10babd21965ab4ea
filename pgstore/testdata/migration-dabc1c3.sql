CREATE UNLOGGED TABLE IF NOT EXISTS "public"."leasehold_locks" (
	key         text COLLATE "C" PRIMARY KEY,
	token       text        NOT NULL,
	fence       bigint      NOT NULL,
	expires_at  timestamptz NOT NULL,
	acquired_at timestamptz NOT NULL
);
ALTER TABLE "public"."leasehold_locks" ADD COLUMN IF NOT EXISTS holder text NOT NULL DEFAULT '';
-- waited: the key may have queue entries or subscriptions, so its releases
-- and acquires go through the functions; false lets the plain-statement
-- fast paths run. Set under the row's lock by every enqueue and
-- subscription; rows written by older versions get true.
ALTER TABLE "public"."leasehold_locks" ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT true;
CREATE UNLOGGED TABLE IF NOT EXISTS "public"."leasehold_locks_waiters" (
	key         text COLLATE "C" NOT NULL,
	token       text        NOT NULL,
	holder      text        NOT NULL DEFAULT '',
	queued      boolean     NOT NULL,
	enqueued_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	PRIMARY KEY (key, token)
);
ALTER TABLE "public"."leasehold_locks_waiters" ADD COLUMN IF NOT EXISTS ttl_us bigint NOT NULL DEFAULT 0; -- the TTL a queued waiter asked for: a release grants it
ALTER TABLE "public"."leasehold_locks_waiters" ADD COLUMN IF NOT EXISTS wake text NOT NULL DEFAULT ''; -- the waiter's store's own NOTIFY channel ('': the shared one)
-- Every waiter's row is updated once per refresh interval (RefreshQueue):
-- room on its page keeps those updates HOT (no new index entry); at the
-- default fillfactor 4 % of them were, and a refresh took 40 % longer.
ALTER TABLE "public"."leasehold_locks_waiters" SET (fillfactor = 50);
CREATE TABLE IF NOT EXISTS "public"."leasehold_locks_counter" (
	one boolean PRIMARY KEY DEFAULT true CHECK (one),
	v   bigint  NOT NULL
);
INSERT INTO "public"."leasehold_locks_counter" (v) VALUES (0) ON CONFLICT DO NOTHING;
-- An older version minted fences from a sequence: its last value is a floor.
DO $mig$ BEGIN
	IF to_regclass('"public"."leasehold_locks_fence"') IS NOT NULL THEN
		EXECUTE format('UPDATE "public"."leasehold_locks_counter" SET v = GREATEST(v, (SELECT last_value FROM %s))', '"public"."leasehold_locks_fence"');
	END IF;
END $mig$;

DROP FUNCTION IF EXISTS "public"."leasehold_locks_acquire"(text, text, bigint, text, bigint, boolean); -- before the channel argument
DROP FUNCTION IF EXISTS "public"."leasehold_locks_acquire"(text, text, bigint, text, bigint, boolean, text, text); -- a development version
-- p_wake is the caller's store's own channel, on which a release notifies it
-- when it heads the queue ('': the shared p_channel).
-- It also keeps the row's waited flag: true while the key may have queue
-- entries or subscriptions.
CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire3"(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	p_wake text,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE plpgsql AS $fn$
DECLARE
	now_ts  timestamptz;
	now_us  bigint;
	r       "public"."leasehold_locks"%ROWTYPE;
	held    boolean;
	head    text;
	me      timestamptz;
	v_fence bigint;
	v_floor bigint;
	v_ahead integer;
	v_waited boolean;
	cfg     text;
BEGIN
	won := false; fence := 0; remaining_us := 0; holder := ''; ahead := 0;
	PERFORM pg_advisory_xact_lock(741525941, hashtext(p_key));
	-- A new statement, so a new snapshot: it sees every row committed before
	-- the lock was granted. Read (and lock) the row before minting a fence:
	-- with no row, nothing can create one while we hold the advisory lock (a
	-- release grants only over the row it deletes), so the fast INSERT's
	-- clock is fresh; an INSERT first could wait for such a release with a
	-- clock read before its grant's fence.
	SELECT * INTO r FROM "public"."leasehold_locks" l WHERE l.key = p_key FOR UPDATE;
	now_ts := clock_timestamp();
	now_us := (extract(epoch FROM now_ts) * 1000000)::bigint;
	IF r.key IS NOT NULL AND NOT (isfinite(r.expires_at) AND isfinite(r.acquired_at) AND r.fence > 0) THEN
		RAISE EXCEPTION 'pgstore: bad lock row for key %', p_key USING ERRCODE = 'data_corrupted',
			HINT = 'delete it: leasehold release KEY --force';
	END IF;
	IF r.key IS NOT NULL AND r.token = p_token THEN -- a retry after a lost reply, or a release granted it to us: same fence
		UPDATE "public"."leasehold_locks" l SET expires_at = now_ts + p_ttl_us * interval '1 microsecond', holder = p_holder WHERE l.key = p_key;
		won := true; fence := r.fence;
		RETURN;
	END IF;
	IF r.key IS NULL THEN -- the common case: a free key with no queue, one INSERT
		INSERT INTO "public"."leasehold_locks" (key, token, holder, fence, expires_at, acquired_at, waited)
		SELECT p_key, p_token, p_holder, GREATEST(now_us, c.v + 1), now_ts + p_ttl_us * interval '1 microsecond', now_ts,
			EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.expires_at > now_ts)
		FROM "public"."leasehold_locks_counter" c
		WHERE NOT EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.queued AND w.expires_at > now_ts)
			AND CASE WHEN p_durable THEN true ELSE set_config('synchronous_commit', 'off', true) IS NOT NULL END
		ON CONFLICT (key) DO NOTHING
		RETURNING "public"."leasehold_locks".fence INTO v_fence;
		IF FOUND THEN
			IF v_fence > now_us THEN -- ahead of the clock, which cannot cover its loss: record it durably
				UPDATE "public"."leasehold_locks_counter" SET v = GREATEST(v, v_fence);
				PERFORM set_config('synchronous_commit', 'on', true);
			END IF;
			won := true; fence := v_fence;
			RETURN;
		END IF;
		-- A release may have granted the key to its queue's head since the
		-- first read (it does not take the advisory lock): read it again.
		SELECT * INTO r FROM "public"."leasehold_locks" l WHERE l.key = p_key FOR UPDATE;
		IF r.key IS NOT NULL AND r.token = p_token THEN -- granted to us by that release
			UPDATE "public"."leasehold_locks" l SET expires_at = now_ts + p_ttl_us * interval '1 microsecond', holder = p_holder WHERE l.key = p_key;
			won := true; fence := r.fence;
			RETURN;
		END IF;
	END IF;
	held := r.key IS NOT NULL AND r.expires_at > now_ts;
	-- One statement reads the queue's head, the floor and whether anyone
	-- else waits, and (unless p_durable) turns off the WAL flush wait for
	-- this transaction.
	SELECT (SELECT w.token FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.queued AND w.expires_at > now_ts
			ORDER BY w.enqueued_at, w.token LIMIT 1),
		(SELECT c.v FROM "public"."leasehold_locks_counter" c),
		EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.token <> p_token AND w.expires_at > now_ts),
		CASE WHEN p_durable THEN '' ELSE set_config('synchronous_commit', 'off', true) END
		INTO head, v_floor, v_waited, cfg;
	IF NOT held AND (head IS NULL OR head = p_token) THEN
		v_fence := GREATEST(coalesce(r.fence, 0) + 1, now_us, v_floor + 1);
		IF r.key IS NULL THEN
			INSERT INTO "public"."leasehold_locks" (key, token, holder, fence, expires_at, acquired_at, waited)
			VALUES (p_key, p_token, p_holder, v_fence, now_ts + p_ttl_us * interval '1 microsecond', now_ts, v_waited)
			ON CONFLICT (key) DO NOTHING;
			IF NOT FOUND THEN -- a row written around the key's lock (by hand): decide again
				RAISE EXCEPTION 'pgstore: row of key % appeared', p_key USING ERRCODE = 'serialization_failure';
			END IF;
		ELSE
			UPDATE "public"."leasehold_locks" l SET token = p_token, holder = p_holder, fence = v_fence,
				expires_at = now_ts + p_ttl_us * interval '1 microsecond', acquired_at = now_ts, waited = v_waited WHERE l.key = p_key;
		END IF;
		IF head IS NOT NULL THEN -- the head took the key: the queue's head changes
			DELETE FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND (w.token = p_token OR w.expires_at <= now_ts);
			IF EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND NOT w.queued AND w.expires_at > now_ts) THEN
				PERFORM pg_notify(p_channel, '0:' || p_key); -- wakes the key's observers only
			END IF;
		END IF;
		IF v_fence > now_us THEN -- ahead of the clock, which cannot cover its loss: record it durably
			UPDATE "public"."leasehold_locks_counter" SET v = GREATEST(v, v_fence);
			PERFORM set_config('synchronous_commit', 'on', true);
		END IF;
		won := true; fence := v_fence;
		RETURN;
	END IF;
	IF held THEN
		remaining_us := (extract(epoch FROM r.expires_at - now_ts) * 1000000)::bigint;
		holder := r.holder;
	END IF;
	IF p_queue_us > 0 THEN
		INSERT INTO "public"."leasehold_locks_waiters" AS w (key, token, holder, queued, enqueued_at, expires_at, ttl_us, wake)
		VALUES (p_key, p_token, p_holder, true, now_ts, now_ts + p_queue_us * interval '1 microsecond', p_ttl_us, p_wake)
		ON CONFLICT (key, token) DO UPDATE SET holder = EXCLUDED.holder, queued = true, ttl_us = EXCLUDED.ttl_us, wake = EXCLUDED.wake,
			-- a subscription row becoming a queue entry takes the queue TTL
			expires_at = CASE WHEN w.queued THEN GREATEST(w.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
			enqueued_at = CASE WHEN w.queued AND w.expires_at > now_ts THEN w.enqueued_at ELSE now_ts END
		RETURNING w.enqueued_at INTO me;
		-- Under the row's lock (taken above): a release that waited for it
		-- reads the flag from the row it then updates.
		UPDATE "public"."leasehold_locks" l SET waited = true WHERE l.key = p_key AND NOT l.waited;
		SELECT count(*) INTO v_ahead FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.queued AND w.expires_at > now_ts
			AND (w.enqueued_at, w.token) < (me, p_token);
	ELSE
		SELECT count(*) INTO v_ahead FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.queued AND w.expires_at > now_ts;
	END IF;
	ahead := v_ahead;
END
$fn$;

-- "public"."leasehold_locks_acquire2" and "public"."leasehold_locks_acquire" are the acquires of earlier versions, kept for
-- replicas that still call them during a rolling upgrade.
CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire2"(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	p_wake text,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE sql AS $fn$
	SELECT * FROM "public"."leasehold_locks_acquire3"(p_key, p_token, p_ttl_us, p_holder, p_queue_us, p_durable, p_channel, p_wake)
$fn$;
CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire"(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE sql AS $fn$
	SELECT * FROM "public"."leasehold_locks_acquire3"(p_key, p_token, p_ttl_us, p_holder, p_queue_us, p_durable, p_channel, '')
$fn$;

-- "public"."leasehold_locks_release" returns 0 (released), 1 (another token holds the key) or 2
-- (nobody holds it). It removes p_token from the queue. When it deleted
-- p_token's own lock and the queue has a live head that asked for a TTL,
-- it grants the key to that head in the same transaction (a new row with
-- the head's token, holder and TTL, capped at its queue deadline, and a
-- fresh fence by the acquire rules) and notifies it on p_channel: 'g', the
-- head token's length in bytes, ':', the token, the fence, ':', the TTL in
-- ms, ':', the key. Otherwise, when the key became free for a new head, it
-- wakes that head (the token's length, ':', the token, the key), or, with
-- no queue, the key's subscribers ('*:' then the key).
-- A grant marks the new row as waited for (its release goes through this
-- function, which re-reads the queue).
CREATE OR REPLACE FUNCTION "public"."leasehold_locks_release2"(p_key text, p_token text, p_channel text, p_durable boolean)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
	now_ts  timestamptz;
	now_us  bigint;
	res     integer;
	f       bigint;
	heads   text[];
	head    text;
	granted text;
	subs    boolean;
	entries boolean;
	mine    boolean := false;
	cfg     text;
	g_holder text;
	g_ttl   bigint;
	g_until timestamptz;
	g_chan  text;
	v_fence bigint;
BEGIN
	-- The key's advisory lock serializes this release with every acquire
	-- and release of the key, so each sees the queue and the lock as the
	-- one before left them: without it, a waiter leaving (p_token holds
	-- nothing) beside a release that grants it the key, or beside an
	-- acquire that makes a new holder whose release then reads the queue
	-- before the leaving waiter's entry is gone, left the key granted to a
	-- waiter that was gone, until its queue deadline.
	PERFORM pg_advisory_xact_lock(741525941, hashtext(p_key));
	now_ts := clock_timestamp();
	now_us := (extract(epoch FROM now_ts) * 1000000)::bigint;
	DELETE FROM "public"."leasehold_locks" l WHERE l.key = p_key AND l.token = p_token
		RETURNING CASE WHEN l.expires_at > now_ts THEN 0 ELSE 2 END, l.fence,
			CASE WHEN p_durable OR l.fence >= now_us THEN '' ELSE set_config('synchronous_commit', 'off', true) END
		INTO res, f, cfg;
	IF NOT FOUND THEN
		-- p_token's own fast acquire (a plain UPDATE of the free row, which
		-- takes the row but not the advisory lock) may not have committed
		-- yet, its caller having given up: wait for whoever holds the
		-- key's row, then look again with a new snapshot, so that such a
		-- grant is released, not left to expire.
		PERFORM 1 FROM "public"."leasehold_locks" l WHERE l.key = p_key FOR UPDATE;
		DELETE FROM "public"."leasehold_locks" l WHERE l.key = p_key AND l.token = p_token
			RETURNING CASE WHEN l.expires_at > now_ts THEN 0 ELSE 2 END, l.fence,
				CASE WHEN p_durable OR l.fence >= now_us THEN '' ELSE set_config('synchronous_commit', 'off', true) END
			INTO res, f, cfg;
	END IF;
	IF NOT FOUND THEN
		SELECT CASE WHEN EXISTS (SELECT 1 FROM "public"."leasehold_locks" l WHERE l.key = p_key AND l.expires_at > now_ts) THEN 1 ELSE 2 END,
			EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key),
			CASE WHEN p_durable THEN '' ELSE set_config('synchronous_commit', 'off', true) END
			INTO res, entries, cfg;
	ELSE
		mine := true;
		-- A statement of its own, so a snapshot taken after the DELETE got
		-- the row: an acquire that held the row's lock while it joined the
		-- queue has committed, and its entry is seen (the DELETE's own
		-- snapshot is from before it waited).
		SELECT EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key) INTO entries;
		IF f >= now_us THEN -- the next grant must come above it without this row
			UPDATE "public"."leasehold_locks_counter" SET v = GREATEST(v, f);
		END IF;
	END IF;
	IF NOT entries THEN -- nobody waits: nothing to notify, no entry to remove
		RETURN res;
	END IF;
	-- The first two live queued tokens and whether there are live
	-- subscriptions.
	SELECT (SELECT array_agg(q.token) FROM (SELECT w.token FROM "public"."leasehold_locks_waiters" w
			WHERE w.key = p_key AND w.queued AND w.expires_at > now_ts ORDER BY w.enqueued_at, w.token LIMIT 2) q),
		EXISTS (SELECT 1 FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND NOT w.queued AND w.expires_at > now_ts AND w.token <> p_token)
		INTO heads, subs;
	IF res <> 1 THEN -- the key is free: hand it to the head, or wake the head if it is new
		IF heads[1] = p_token THEN -- the head leaves: the next one is the new head
			head := heads[2];
		ELSIF res = 0 OR mine THEN
			head := heads[1];
		END IF;
		IF head IS NOT NULL THEN -- notify the head on its store's own channel, when it has one
			SELECT w.holder, w.ttl_us, w.expires_at, coalesce(nullif(w.wake, ''), p_channel) INTO g_holder, g_ttl, g_until, g_chan
				FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND w.token = head;
			IF NOT FOUND THEN -- the head left since the queue was read: nobody to notify or grant
				head := NULL;
			END IF;
		END IF;
		IF head IS NOT NULL AND mine THEN -- we held the row: grant the key to the head
			IF g_ttl > 0 THEN -- 0: queued by an older version, which acquires itself
				v_fence := GREATEST(f + 1, now_us, (SELECT c.v FROM "public"."leasehold_locks_counter" c) + 1);
				INSERT INTO "public"."leasehold_locks" (key, token, holder, fence, expires_at, acquired_at, waited)
				VALUES (p_key, head, g_holder, v_fence, LEAST(now_ts + g_ttl * interval '1 microsecond', g_until), now_ts, true)
				ON CONFLICT (key) DO NOTHING;
				IF FOUND THEN
					IF v_fence > now_us THEN -- ahead of the clock: record it durably
						UPDATE "public"."leasehold_locks_counter" SET v = GREATEST(v, v_fence);
						PERFORM set_config('synchronous_commit', 'on', true);
					END IF;
					granted := head;
					PERFORM pg_notify(g_chan, 'g' || octet_length(head) || ':' || head || v_fence || ':' || (g_ttl / 1000) || ':' || p_key);
					IF subs AND g_chan <> p_channel THEN -- the key changed hands: its observers learn it
						PERFORM pg_notify(p_channel, '0:' || p_key);
					END IF;
				END IF;
			END IF;
		END IF;
		IF granted IS NOT NULL THEN
			NULL; -- notified above
		ELSIF head IS NOT NULL THEN
			PERFORM pg_notify(g_chan, octet_length(head) || ':' || head || p_key);
			IF subs AND g_chan <> p_channel THEN
				PERFORM pg_notify(p_channel, '0:' || p_key);
			END IF;
		ELSIF res = 0 AND heads IS NULL AND subs THEN
			PERFORM pg_notify(p_channel, '*:' || p_key);
		END IF;
	END IF;
	DELETE FROM "public"."leasehold_locks_waiters" w WHERE w.key = p_key AND (w.token = p_token OR w.token = granted OR w.expires_at <= now_ts);
	RETURN res;
END
$fn$;

-- "public"."leasehold_locks_release" is the release of earlier versions, kept for replicas that
-- still call it during a rolling upgrade.
CREATE OR REPLACE FUNCTION "public"."leasehold_locks_release"(p_key text, p_token text, p_channel text, p_durable boolean)
RETURNS integer LANGUAGE sql AS $fn$
	SELECT "public"."leasehold_locks_release2"(p_key, p_token, p_channel, p_durable)
$fn$;

-- "public"."leasehold_locks_force_release" deletes the key's lock whatever its token, returns it and wakes
-- the head (or the subscribers) as a release does.
CREATE OR REPLACE FUNCTION "public"."leasehold_locks_force_release"(p_key text, p_channel text, p_durable boolean)
RETURNS TABLE (key text, token text, holder text, fence bigint, expires_at timestamptz, acquired_at timestamptz, now_us bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
	r      "public"."leasehold_locks"%ROWTYPE;
	now_ts timestamptz;
BEGIN
	PERFORM pg_advisory_xact_lock(741525941, hashtext(p_key));
	SELECT * INTO r FROM "public"."leasehold_locks" l WHERE l.key = p_key FOR UPDATE;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	PERFORM "public"."leasehold_locks_release2"(p_key, r.token, p_channel, p_durable);
	now_ts := clock_timestamp();
	IF r.expires_at > now_ts THEN
		RETURN QUERY SELECT r.key, r.token, r.holder, r.fence, r.expires_at, r.acquired_at, (extract(epoch FROM now_ts) * 1000000)::bigint;
	END IF;
END
$fn$;
