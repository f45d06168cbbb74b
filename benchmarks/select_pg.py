"""Baselines in PostgreSQL (issue 48): writing and reading a generation of 10,000 tests.

The synthetic project and baseline of select_cost.py (100 modules of 30 functions in git,
10,000 tests of 40 blocks and 8 shared libraries each, one function changed), kept in a
throwaway PostgreSQL server on 127.0.0.1 (tests/pg_server.py) instead of .devpool/select:

- write: `PgStore.write`, one generation published in one transaction;
- read: `PgStore.newest` and the checksum and parse of what it returned;
- select: `diff.select` from the database, as `--devpool-select on` calls it;
- parts: the same 10,000 tests sent as a queue run's jobs send them (`send_parts`, in
  batches of 100 packed as a generation's database), then read back and published once,
  as the run's last job does.

Targets: read and write <= 1 s each.

    python benchmarks/select_pg.py [--tests 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# psycopg first, without this folder on the path: its concurrent.py shadows the stdlib's
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import psycopg  # noqa: E402, F401

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from select_cost import synthetic_baseline  # noqa: E402

from devpool.select.baseline import bucket_of, check_generation, identity, identity_key  # noqa: E402
from devpool.select.diff import Current, select  # noqa: E402
from devpool.select.fleet import database_of, pack_part, unpack_parts  # noqa: E402
from devpool.select.options import select_options  # noqa: E402
from devpool.select.session import store_for  # noqa: E402
from devpool.select.store_pg import PgStore  # noqa: E402
from pg_server import remove, server_bin, start_server  # noqa: E402

TARGET_S = 1.0


def timed(action: Callable[[], Any], repeat: int) -> tuple[float, float, float]:
    took = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        took.append(time.perf_counter() - start)
    return statistics.median(took), min(took), max(took)


def say(name: str, figures: tuple[float, float, float], target: float | None = None) -> None:
    median, low, high = figures
    verdict = ""
    if target is not None:
        verdict = f"  target <= {target:g} s: {'met' if median <= target else 'MISSED'}"
    print(f"  {name:<44} median {median:.3f} s (range {low:.3f}–{high:.3f}){verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if server_bin() is None:
        sys.exit("needs PostgreSQL's server binaries (initdb, pg_ctl)")
    server = start_server()
    try:
        with tempfile.TemporaryDirectory(prefix="devpool-select-pg-") as tmp:
            root = Path(tmp)
            changed, users = synthetic_baseline(root, args.tests, seed=1)
            generation = store_for(root).latest(bucket_of(root, root, ["tests"], "", "").id)
            assert generation is not None
            manifest, database = check_generation(
                (generation / "manifest.json").read_bytes(),
                (generation / "deps.json").read_bytes(),
                "synthetic",
            )
            size = (generation / "deps.json").stat().st_size
            print(f"{args.tests} tests, deps.json {size / 1e6:.1f} MB, {args.repeat} runs each:")
            store = PgStore(server.url)
            keep = {k: v for k, v in manifest.items() if k not in ("generation", "created")}
            say("write (publish one generation)", timed(lambda: store.write(keep, database),
                                                         args.repeat), TARGET_S)  # fmt: skip
            bucket = manifest["bucket"]["id"]
            key = identity_key(bucket, "sim", 2, manifest["identity"])

            def read() -> None:
                found = store.newest(bucket, key)
                assert found is not None
                check_generation(found[1], found[2], found[0])

            say("read (newest, checksum, parse)", timed(read, args.repeat), TARGET_S)
            options = select_options({}, "pyproject.toml")
            current = Current(
                root,
                bucket_of(root, root, ["tests"], "", ""),
                options,
                identity(options.key_packages),
                platform="sim",
                inifile="pyproject.toml",
                devices={f"tests/test_{n // 100}.py::test_{n}": 0 for n in range(args.tests)},
                pool=2,
            )
            selection = select(store, current)
            assert selection.full_reason is None, selection.full_reason
            say(
                f"select from the database ({len(selection.selected)} of {args.tests}; "
                f"{users} use {changed})",
                timed(lambda: select(store, current), args.repeat),
            )
            blocks, libs = database["blocks"], database["libs"]
            entries = {
                nodeid: {
                    **{k: test[k] for k in ("outcome", "devices", "recorded", "why", "globs")},
                    "blocks": dict(blocks[i] for i in test["blocks"]),
                    "files": {},
                    "libs": {libs[i][0]: libs[i][1:] for i in test["libs"]},
                }
                for nodeid, test in database["tests"].items()
            }
            names = list(entries)
            runs = iter(range(10**6))

            def send() -> str:
                run = f"bench-{next(runs)}"
                for at in range(0, len(names), 100):
                    batch = {n: entries[n] for n in names[at : at + 100]}
                    store.send_parts(run, pack_part(root, batch))
                return run

            sent = []
            say("parts: 10,000 tests sent in batches of 100",
                timed(lambda: sent.append(send()), args.repeat))  # fmt: skip

            def publish() -> None:
                run = sent.pop()
                store.write(keep, database_of(root, unpack_parts(store.parts(run))[0]), run=run)

            say("parts: read back and published once", timed(publish, args.repeat))
    finally:
        server.stop()
        remove(server)


if __name__ == "__main__":
    main()
