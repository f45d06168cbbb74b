"""The queue's tables in PostgreSQL (store.py makes them once, under an advisory lock)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS devpool_queue_runs (
    run_id text PRIMARY KEY,
    fingerprint text NOT NULL,
    tests integer NOT NULL,
    published_by text NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS devpool_queue_jobs (
    job_id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    devices integer NOT NULL,
    platform text NOT NULL,
    lease_seconds double precision NOT NULL,
    joined_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    left_at timestamptz,
    lost boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS devpool_queue_tests (
    run_id text NOT NULL,
    position integer NOT NULL,
    test_id text NOT NULL,
    devices integer NOT NULL,
    request text NOT NULL,
    estimate double precision NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    job_id bigint,
    token bigint,
    claims integer NOT NULL DEFAULT 0,
    outcome text,
    gating boolean,
    result jsonb,
    ended_at timestamptz,
    PRIMARY KEY (run_id, position),
    UNIQUE (run_id, test_id)
);
-- A rerun moved off the job (and host) its attempt failed on: which attempt is next, the
-- reruns spent, and the earlier attempts as the final report folds them in.
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 1;
ALTER TABLE devpool_queue_tests
    ADD COLUMN IF NOT EXISTS spent integer[] NOT NULL DEFAULT '{0,0,0}';
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS avoid_job bigint;
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS avoid_host text;
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS earlier jsonb NOT NULL DEFAULT '[]';
-- Tests tied by pytest-order or pytest-dependency: the first test's id, claimed with it.
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS chain text NOT NULL DEFAULT '';
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS moved_at timestamptz;
-- Hardware classes (queue/classes.py): the platforms a test runs on ('' any), the kind of a
-- job's platform, the classes a run declared it covers ('' all).
ALTER TABLE devpool_queue_jobs ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT '';
ALTER TABLE devpool_queue_runs ADD COLUMN IF NOT EXISTS classes text NOT NULL DEFAULT '';
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS platforms text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS devpool_queue_tests_state ON devpool_queue_tests (run_id, state);
CREATE SEQUENCE IF NOT EXISTS devpool_queue_token;
"""
SCHEMA_LOCK = 0x646576706F6F6C  # pg_advisory_xact_lock key: two jobs creating tables at once
NEWEST_COLUMN = "platforms"  # a database without it was made by an older devpool: SCHEMA again
