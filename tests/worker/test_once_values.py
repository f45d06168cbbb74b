"""worker/once.py: a once-fixture's outcome in its file, and a test's fixture closure less
what only its once-fixtures need."""

from __future__ import annotations

import pickle
import socket
from pathlib import Path
from types import SimpleNamespace

from devpool.worker.once import closure_without, result_path, unpicklable, write_result


def test_the_outcome_file_is_written_whole(tmp_path: Path) -> None:
    folder = tmp_path / "once"
    write_result(folder, "server", "value", pickle.dumps({"port": 8000}))
    kind, payload = pickle.loads(result_path(folder, "server").read_bytes())
    assert kind == "value" and pickle.loads(payload) == {"port": 8000}
    assert [p.name for p in folder.iterdir()] == ["server.pickle"]  # no partial file left


def test_an_unpicklable_value_is_one_sentence_naming_fixture_and_type() -> None:
    with socket.socket() as sock:
        try:
            pickle.dumps(sock)
        except TypeError as exc:
            said = unpicklable("server", sock, exc)
    assert said.startswith("[tool.devpool.once] server's value, of type socket.socket, cannot")
    assert "\n" not in said


def definition(*argnames: str) -> SimpleNamespace:
    return SimpleNamespace(argnames=argnames)


def test_the_closure_keeps_what_the_test_asks_for_itself() -> None:
    definitions = {
        "server": [definition("weights", "tmp_path_factory")],
        "weights": [definition("tmp_path_factory")],
        "tmp_path_factory": [definition()],
        "client": [definition("weights")],
        "auto": [definition()],
    }
    closure = ["auto", "server", "client", "weights", "tmp_path_factory"]
    # The test asks for server (once) and client: weights stays for client's sake.
    kept = closure_without(closure, ["auto", "server", "client"], definitions, {"server"})
    assert kept == ["auto", "server", "client", "weights", "tmp_path_factory"]
    # Without client, what only server needed is its own process's alone.
    kept = closure_without(closure, ["auto", "server"], definitions, {"server"})
    assert kept == ["auto", "server"]


def test_a_shipped_outcome_answers_without_a_folder() -> None:
    """On Ray (no shared folder) a batch brings its once-fixtures' outcomes (Run.once)."""
    from devpool.worker.once import OnceValues, shipped

    values = OnceValues(SimpleNamespace(), ["server", "other"])  # type: ignore[arg-type]
    values.given({"server": shipped("value", pickle.dumps({"port": 8000}))})
    assert values._result("server") == ("value", {"port": 8000})  # noqa: SLF001
    assert values._result("other") is None  # not given, no folder: an ordinary fixture here
    values.given({"other": shipped("skip", "no device today")})
    assert values._result("other") == ("skip", "no device today")  # noqa: SLF001


def test_the_controller_ships_each_outcome_once_per_worker() -> None:
    """run/once.py's values_for: a worker gets a fixture's outcome with the first batch
    that uses it, never again; a batch of tests that do not use it carries nothing."""
    from devpool.plan.jobs import Job
    from devpool.plan.markers import Request
    from devpool.plan.once import OnceFixture
    from devpool.run.once import OnceFixtures

    check = SimpleNamespace(fixtures=[OnceFixture("server", Request())], skipped={})
    items = {"t::a": SimpleNamespace(fixturenames=["server"]),
             "t::b": SimpleNamespace(fixturenames=["tmp_path"])}  # fmt: skip
    ctx = SimpleNamespace(items=items, run_dir=Path("/nonexistent"))
    plugins = SimpleNamespace(get_plugin=lambda name: check)
    loop = SimpleNamespace(ctx=ctx, session=SimpleNamespace(config=SimpleNamespace(
        pluginmanager=plugins)), backend=SimpleNamespace(local_leases=False),
        pool=SimpleNamespace())  # fmt: skip
    once = OnceFixtures(loop)  # type: ignore[arg-type]
    assert loop.pool.once_values == once.values_for  # on Ray: batches carry outcomes
    once.outcomes["server"] = "b64"
    jobs = [Job(i, nodeid, ("t", 0, nodeid), Request(), i) for i, nodeid in enumerate(items)]
    user, other = (SimpleNamespace(job=job) for job in jobs)
    first, second = SimpleNamespace(key=1), SimpleNamespace(key=2)
    assert once.values_for(first, [other]) is None  # type: ignore[arg-type]
    assert once.values_for(first, [other, user]) == {"server": "b64"}  # type: ignore[arg-type]
    assert once.values_for(first, [user]) is None  # type: ignore[arg-type]
    assert once.values_for(second, [user]) == {"server": "b64"}  # type: ignore[arg-type]
