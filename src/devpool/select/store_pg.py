"""Baselines in the fleet's PostgreSQL (`--devpool-history=postgresql://…`), beside its history.

The generations live in the history's schema, `devpool_history`: `select_generations` holds
each one whole (its manifest, its database compressed, the database's sha256 in the
manifest), found by bucket and identity key (baseline.identity_key), the newest first. One
INSERT publishes one, in the transaction that also drops all but the newest KEEP of its
bucket and identity: a reader sees a whole generation or none, and of two recordings
published at once the later one wins. `select_parts` holds what the jobs of one recording
run (a queue run, or shards) sent, one row per test, until the run is published once
(`select_runs`). `select_runs` also pins the generation a selective queue run chose, so its
jobs select alike however the fleet records meanwhile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from devpool.database import FLEET_SCHEMA as SCHEMA
from devpool.database import connect, driver, shown, tables_version, under_lock
from devpool.errors import DevpoolError
from devpool.select.baseline import BaselineProblem, check_generation, identity_key
from devpool.select.options import DEFAULT_KEEP

TABLES = 1  # the version of these tables; a newer devpool's are read by none older
KEEP = DEFAULT_KEEP  # generations kept per bucket and identity, unless keep says
# A selective queue run's jobs select from the generation its first job pinned: kept, however
# many are recorded meanwhile, for this long; a run's row is forgotten after it.
PINNED = "interval '1 day'"
_LOCK = 0x64707365  # pg_advisory_xact_lock key: two runners making the tables at once
_CREATE = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.select_generations (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    generation TEXT NOT NULL UNIQUE,
    bucket TEXT NOT NULL,
    identity TEXT NOT NULL,
    manifest TEXT NOT NULL,
    deps BYTEA NOT NULL,
    made TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS select_generations_newest
    ON {SCHEMA}.select_generations (bucket, identity, id DESC);
CREATE TABLE IF NOT EXISTS {SCHEMA}.select_parts (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run TEXT NOT NULL,
    body BYTEA NOT NULL,
    made TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS select_parts_of_run ON {SCHEMA}.select_parts (run, id);
CREATE TABLE IF NOT EXISTS {SCHEMA}.select_runs (
    run TEXT NOT NULL,
    bucket TEXT NOT NULL,
    generation TEXT,
    published BOOLEAN NOT NULL DEFAULT false,
    made TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run, bucket)
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.select_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO {SCHEMA}.select_meta VALUES ('schema', '{TABLES}') ON CONFLICT DO NOTHING;
"""
# A recording queue run's classes that no job of theirs took: no baseline, and why (issue 56).
_UNCOVERED = f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.select_uncovered (
    bucket TEXT NOT NULL, platform TEXT NOT NULL, run TEXT NOT NULL, why TEXT NOT NULL,
    made TIMESTAMPTZ NOT NULL DEFAULT now())"""
_NEWEST = (
    f"SELECT generation, manifest, deps FROM {SCHEMA}.select_generations "
    "WHERE bucket = %s AND identity = %s ORDER BY id DESC LIMIT 1"
)


def generation_name(now: float | None = None) -> str:
    """A new generation's id: its time (ids sort by it) and a random tail."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{stamp}.{int(now * 1e6) % 1000000:06d}Z-{uuid.uuid4().hex[:6]}"


def sealed(
    manifest: Mapping[str, Any], database: Mapping[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """The manifest with its generation id, time and the database's sha256; the database's
    bytes (as a file store writes them)."""
    data = json.dumps(database, separators=(",", ":"), sort_keys=True).encode()
    full = {
        **manifest,
        "generation": generation_name(),
        "created": time.time(),
        "db_sha256": hashlib.sha256(data).hexdigest(),
    }
    return full, data


class PgStore:
    """The generations of every bucket in one PostgreSQL database; a connection per use."""

    def __init__(self, url: str, option: str = "--devpool-history", keep: int = KEEP) -> None:
        self.url = url
        self.option = option
        self.keep = keep  # generations kept per bucket and identity ([tool.devpool.select])
        self.where = shown(url)
        self._kept: Any = None  # the connection a job sends its parts on, for the run

    def _connect(self, make: bool) -> Any:
        """A connection whose select tables are there (made when `make`), else None when
        they are not; DevpoolError in one sentence when the database cannot be used."""
        conn = connect(self.url, self.option)
        try:
            version = tables_version(conn, f"{SCHEMA}.select_meta")
            if version is None and make:
                with under_lock(conn, _LOCK):
                    conn.execute(_CREATE)
                version = tables_version(conn, f"{SCHEMA}.select_meta")
            if version is None:
                conn.close()
                return None
        except driver(self.option).Error as exc:
            conn.close()
            raise DevpoolError(f"baselines in {self.where} cannot be used: {_said(exc)}") from None
        if version > TABLES:
            conn.close()
            raise DevpoolError(
                f"baselines in {self.where} were written by a newer devpool (tables {version}); "
                f"this one reads {TABLES}"
            )
        return conn

    # ---- reading ---------------------------------------------------------------------------

    def newest(
        self, bucket_id: str, key: str, pin: str | None = None
    ) -> tuple[str, bytes, bytes] | None:
        """The newest generation of this bucket and identity key: (id, manifest, database);
        None when there is none. With `pin` (a queue run), the one that run's first job
        chose. BaselineProblem when the database cannot be read."""
        try:
            conn = self._connect(make=pin is not None)
        except DevpoolError as exc:
            raise BaselineProblem(str(exc)) from None
        if conn is None:
            return None
        try:
            with conn:
                row = self._pinned(conn, bucket_id, key, pin) if pin else None
                if row is None and not pin:
                    row = conn.execute(_NEWEST, (bucket_id, key)).fetchone()
        except driver(self.option).Error as exc:
            raise BaselineProblem(f"baselines in {self.where}: {_said(exc)}") from None
        if row is None:
            return None
        return str(row[0]), str(row[1]).encode(), zlib.decompress(bytes(row[2]))

    def _pinned(self, conn: Any, bucket_id: str, key: str, run: str) -> Any:
        """The generation a queue run's jobs all select from: the first job's newest."""
        with conn.transaction():
            conn.execute(
                f"INSERT INTO {SCHEMA}.select_runs (run, bucket, generation) "
                f"SELECT %s, %s, ({_NEWEST.replace('generation, manifest, deps', 'generation')}) "
                "ON CONFLICT DO NOTHING",
                (run, bucket_id, bucket_id, key),
            )
            return conn.execute(
                f"SELECT g.generation, g.manifest, g.deps FROM {SCHEMA}.select_runs r "
                f"JOIN {SCHEMA}.select_generations g ON g.generation = r.generation "
                "WHERE r.run = %s AND r.bucket = %s",
                (run, bucket_id),
            ).fetchone()

    # ---- writing ---------------------------------------------------------------------------

    def write(
        self,
        manifest: Mapping[str, Any],
        database: Mapping[str, Any],
        run: str | None = None,
        pools: Sequence[int] = (),
        shapes: Sequence[tuple[str, int]] = (),
        uncovered: Sequence[tuple[str, str]] = (),
    ) -> str | None:
        """Publish one generation in one transaction, the oldest beyond KEEP of its bucket
        and identity dropped; its id. With `run`: once for that run (None when another job
        of it published first). With `pools` (a queue run whose jobs had runners of several
        sizes): one generation for each, alike but for the pool, in the same transaction;
        the first one's id. DevpoolError when the database cannot take it."""
        pairs: list[tuple[str | None, int]] = list(shapes) or [
            (manifest.get("platform"), pool) for pool in (pools or [manifest["shape"]["pool"]])
        ]
        made = [
            {**manifest, "platform": platform, "shape": {**manifest["shape"], "pool": pool}}
            for platform, pool in pairs
        ]
        sealed_all = [sealed(shape, database) for shape in made]
        bucket = str(manifest["bucket"]["id"])
        conn = self._connect(make=True)
        assert conn is not None  # made
        try:
            with conn, conn.transaction():
                if run is not None:
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (run,))
                    done = conn.execute(
                        f"SELECT 1 FROM {SCHEMA}.select_runs WHERE run = %s AND bucket = %s "
                        "AND published",
                        (run, bucket),
                    ).fetchone()
                    if done is not None:
                        return None
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.select_runs (run, bucket, generation, published) "
                        "VALUES (%s, %s, %s, true) ON CONFLICT (run, bucket) DO UPDATE "
                        "SET generation = EXCLUDED.generation, published = true",
                        (run, bucket, sealed_all[0][0]["generation"]),
                    )
                for full, data in sealed_all:
                    self._insert(conn, full, data)
                if uncovered:  # classes the run did not cover: no baseline, and why
                    conn.execute(_UNCOVERED)
                    for platform, why in uncovered:
                        conn.execute(
                            f"INSERT INTO {SCHEMA}.select_uncovered VALUES (%s, %s, %s, %s)",
                            (bucket, platform, run, why),
                        )
                if run is not None:
                    conn.execute(f"DELETE FROM {SCHEMA}.select_parts WHERE run = %s", (run,))
        except driver(self.option).Error as exc:
            raise DevpoolError(f"cannot write a baseline to {self.where}: {_said(exc)}") from None
        return str(sealed_all[0][0]["generation"])

    def why_none(self, bucket_id: str, platform: str) -> str | None:
        """Why the newest recording of this bucket made no baseline for this platform (its
        run did not cover the class); None when none says so."""
        try:
            conn = self._connect(make=False)
            if conn is None:
                return None
            with conn:
                found = conn.execute(f"SELECT to_regclass('{SCHEMA}.select_uncovered')")
                if (found.fetchone() or (None,))[0] is None:
                    return None
                row = conn.execute(
                    f"SELECT run, why FROM {SCHEMA}.select_uncovered WHERE bucket = %s "
                    "AND platform = %s ORDER BY made DESC LIMIT 1",
                    (bucket_id, platform),
                ).fetchone()
        except (DevpoolError, driver(self.option).Error):
            return None
        return None if row is None else f"recording run {row[0]} made none for it: {row[1]}"

    def _insert(self, conn: Any, full: Mapping[str, Any], data: bytes) -> None:
        """One sealed generation, and its bucket and identity trimmed to the newest KEEP."""
        bucket = str(full["bucket"]["id"])
        key = identity_key(bucket, full.get("platform"), full["shape"]["pool"], full["identity"])
        # One writer of a bucket and identity at a time: an import's "is there a newer one"
        # and its insert see no recording publish between them (the lock is re-entrant).
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
        conn.execute(
            f"INSERT INTO {SCHEMA}.select_generations (generation, bucket, identity, manifest, "
            "deps) VALUES (%s, %s, %s, %s, %s)",
            (full["generation"], bucket, key, json.dumps(full, sort_keys=True),
             zlib.compress(data, 1)),
        )  # fmt: skip
        self._keep_newest(conn, bucket, key)

    # ---- what a person reads and moves: `devpool select`, export, import ------------------

    def shapes(self, bucket_id: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """The newest generation of every bucket and identity key (of one bucket): (id, key,
        manifest), the newest first; [] when there is none. DevpoolError when unreadable."""
        conn = self._connect(make=False)
        if conn is None:
            return []
        where, params = ("WHERE bucket = %s", (bucket_id,)) if bucket_id else ("", ())
        try:
            with conn:
                rows = conn.execute(
                    f"SELECT * FROM (SELECT DISTINCT ON (bucket, identity) id, generation, "
                    f"identity, manifest FROM {SCHEMA}.select_generations {where} "
                    "ORDER BY bucket, identity, id DESC) newest ORDER BY id DESC",
                    params,
                ).fetchall()
        except driver(self.option).Error as exc:
            raise DevpoolError(f"cannot read baselines in {self.where}: {_said(exc)}") from None
        return [(str(row[1]), str(row[2]), json.loads(row[3])) for row in rows]

    def generation(self, name: str) -> tuple[str, bytes, bytes]:
        """One generation by its id: (id, manifest, database); DevpoolError when gone."""
        conn = self._connect(make=False)
        row = None
        try:
            if conn is not None:
                with conn:
                    row = conn.execute(
                        f"SELECT generation, manifest, deps FROM {SCHEMA}.select_generations "
                        "WHERE generation = %s",
                        (name,),
                    ).fetchone()
        except driver(self.option).Error as exc:
            raise DevpoolError(f"cannot read baselines in {self.where}: {_said(exc)}") from None
        if row is None:
            raise DevpoolError(f"baseline {name} is no longer in {self.where}")
        return str(row[0]), str(row[1]).encode(), zlib.decompress(bytes(row[2]))

    def add(self, manifest_bytes: bytes, database_bytes: bytes) -> str:
        """Add a checked generation (an import) under its own id, in the transaction that
        keeps the newest KEEP of its bucket and identity: "added"; "present" when it is
        there; "older" (not added) when a newer one of its bucket and identity is there,
        so that an import never hides what the fleet recorded since."""
        manifest, _ = check_generation(manifest_bytes, database_bytes, "the archive's baseline")
        bucket, name = str(manifest["bucket"]["id"]), str(manifest["generation"])
        pool = (manifest.get("shape") or {}).get("pool")
        key = identity_key(bucket, manifest.get("platform"), pool, manifest.get("identity", {}))
        table = f"{SCHEMA}.select_generations"
        conn = self._connect(make=True)
        assert conn is not None  # made
        try:
            with conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
                if conn.execute(f"SELECT 1 FROM {table} WHERE generation = %s", (name,)).fetchone():
                    return "present"
                newest = conn.execute(_NEWEST, (bucket, key)).fetchone()
                if newest is not None and str(newest[0]) > name:
                    return "older"
                self._insert(conn, manifest, database_bytes)
        except driver(self.option).Error as exc:
            raise DevpoolError(f"cannot write a baseline to {self.where}: {_said(exc)}") from None
        return "added"

    def _keep_newest(self, conn: Any, bucket: str, key: str) -> None:
        """All but the newest `keep` of a bucket and identity dropped, but for a generation a
        queue run still selecting from pinned; runs' rows older than PINNED forgotten."""
        table = f"{SCHEMA}.select_generations"
        runs = f"{SCHEMA}.select_runs"
        conn.execute(f"DELETE FROM {runs} WHERE made < now() - {PINNED}")
        conn.execute(
            f"DELETE FROM {table} WHERE bucket = %s AND identity = %s AND id NOT IN "
            f"(SELECT id FROM {table} WHERE bucket = %s AND identity = %s "
            "ORDER BY id DESC LIMIT %s) AND generation NOT IN "
            f"(SELECT generation FROM {runs} WHERE NOT published AND generation IS NOT NULL)",
            (bucket, key, bucket, key, self.keep),
        )

    # ---- one recording across jobs ---------------------------------------------------------

    def send_parts(self, run: str, body: bytes) -> None:
        """One batch of the tests a job recorded (fleet.pack_part), kept in the order sent:
        a test sent again (a retry, a lost job's rerun) is read back as its last entry."""
        try:
            if self._kept is None:
                self._kept = self._connect(make=True)
            self._kept.execute(
                f"INSERT INTO {SCHEMA}.select_parts (run, body) VALUES (%s, %s)", (run, body)
            )
        except (DevpoolError, driver(self.option).Error) as exc:
            self.close()
            raise DevpoolError(f"cannot send dependencies to {self.where}: {_said(exc)}") from None

    def parts(self, run: str) -> list[bytes]:
        """Every batch the jobs of `run` sent, in the order they arrived."""
        conn = self._connect(make=True)
        assert conn is not None
        try:
            with conn:
                rows = conn.execute(
                    f"SELECT body FROM {SCHEMA}.select_parts WHERE run = %s ORDER BY id", (run,)
                ).fetchall()
        except driver(self.option).Error as exc:
            raise DevpoolError(f"cannot read dependencies in {self.where}: {_said(exc)}") from None
        return [bytes(row[0]) for row in rows]

    def close(self) -> None:
        """Close the connection kept for sending parts."""
        if self._kept is not None:
            kept, self._kept = self._kept, None
            with contextlib.suppress(Exception):
                kept.close()


def _said(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
