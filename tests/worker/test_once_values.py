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
