"""Where a report ran, in the shape pytest's terminal reads xdist's worker from."""

from __future__ import annotations

import json

from devpool.report.terminal import where_ran


def test_one_object_per_place_read_as_xdist_worker_and_written_as_json() -> None:
    where = where_ran("sim:2,3")
    assert where is where_ran("sim:2,3")  # --junitxml keys a test's phases by it
    assert where.gateway.id == "sim:2,3"  # pytest's -v writes "[sim:2,3] [ 50%] PASSED ..."
    assert where._workerinfocache == ""  # no worker line above a failure
    # A plugin that writes reports as JSON (pytest-reportlog) gets the place.
    assert json.dumps({"node": where}) == '{"node": "sim:2,3"}'
