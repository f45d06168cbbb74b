"""compat/fixtures.py: every fixture definition of a session, on the pytest installed
(the README's install takes the newest pytest; CI's [dev] pins another)."""

from __future__ import annotations

import pytest

from devpool.compat.fixtures import fixture_definitions


def test_every_definition_of_a_name_is_found_once(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef server():\n    return 1\n"
    )
    pytester.makepyfile(
        test_a="import pytest\n\n@pytest.fixture\ndef server():\n    return 2\n\n"
        "def test_a(server):\n    assert server == 2\n"
    )
    found: dict[str, list[object]] = {}

    class Look:
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            found.update(fixture_definitions(session))

    result = pytester.inline_run("-p", "no:devpool", plugins=[Look()])
    result.assertoutcome(passed=1)
    scopes = sorted(d.scope for d in found["server"])  # type: ignore[attr-defined]
    assert scopes == ["function", "session"], found["server"]
    assert "tmp_path" in found  # the plugins' fixtures too
    assert len({id(d) for d in found["server"]}) == len(found["server"])
