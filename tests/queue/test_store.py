"""The queue store against a real PostgreSQL server (tests/queue/conftest.py starts one)."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from devpool.database import connect, failure_sentence
from devpool.errors import DevpoolError
from devpool.queue.heartbeat import Heartbeat
from devpool.queue.store import QueuedTest, QueueStore
from pg_server import Server

_runs = itertools.count()


@pytest.fixture
def run_id() -> str:
    return f"run-{time.time_ns()}-{next(_runs)}"


@pytest.fixture
def store(postgres: Server, run_id: str) -> Iterator[QueueStore]:
    queue = QueueStore(postgres.url, run_id)
    yield queue
    queue.close()


def suite() -> list[QueuedTest]:
    return [
        QueuedTest("t.py::cpu_a", 0, "cpu", 1.0),
        QueuedTest("t.py::cpu_b", 0, "cpu", 3.0),
        QueuedTest("t.py::one", 1, "1 device", 2.0),
        QueuedTest("t.py::two", 2, "2 devices", 5.0),
        QueuedTest("t.py::four", 4, "4 devices", 4.0),
        QueuedTest("t.py::eight", 8, "8 devices", 9.0),
    ]


def test_first_job_publishes_later_ones_check(postgres: Server, store: QueueStore) -> None:
    assert store.publish(suite(), "host-a") is True
    other = QueueStore(postgres.url, store.run_id)
    try:
        assert other.publish(suite(), "host-b") is False
        assert [t.test_id for t in other.tests()] == [t.test_id for t in suite()]
    finally:
        other.close()


def test_differing_collection_refused_in_one_sentence(postgres: Server, store: QueueStore) -> None:
    store.publish(suite(), "host-a")
    mine = [*suite()[1:-1], QueuedTest("t.py::new", 0, "cpu", 1.0)]
    mine[1] = QueuedTest("t.py::one", 2, "2 devices", 2.0)
    with pytest.raises(DevpoolError) as caught:
        store.publish(mine, "host-b")
    sentence = str(caught.value)
    assert "\n" not in sentence
    assert "as host-a published it" in sentence
    assert "lacks 2 tests (t.py::cpu_a, t.py::eight)" in sentence
    assert "has 1 test the run does not (t.py::new)" in sentence
    assert "t.py::one (2 here, 1 there)" in sentence


def test_claims_longest_first_within_the_jobs_devices(store: QueueStore) -> None:
    store.publish(suite(), "host")
    job = store.join("host", 1, 2, "sim", 30)
    claims = store.claim(job, devices=2, seconds=100)
    # device-seconds, longest first; never the 4- or 8-device tests
    assert [c.test_id for c in claims] == ["t.py::two", "t.py::cpu_b", "t.py::one", "t.py::cpu_a"]
    assert store.claim(job, devices=2, seconds=100) == []
    assert store.open_for(2) == 4 and store.open_for(8) == 6


def test_batches_are_sized_from_estimates(store: QueueStore) -> None:
    store.publish([QueuedTest(f"t.py::t{i}", 0, "cpu", 0.01) for i in range(100)], "host")
    job = store.join("host", 1, 0, "cpu", 30)
    first = store.claim(job, devices=0, seconds=0.5)
    assert len(first) == 50
    assert len(store.claim(job, devices=0, seconds=0.001)) == 1  # at least one test


def test_report_once_and_refused_after_the_lease_is_lost(store: QueueStore) -> None:
    store.publish(suite()[:2], "host")
    slow = store.join("slow", 1, 0, "cpu", 0.2)
    claims = store.claim(slow, devices=0, seconds=100)
    assert len(claims) == 2
    assert store.report(slow, claims[0], "passed", False, {"x": 1})
    assert not store.report(slow, claims[0], "failed", True)  # a second report of one test
    other = store.join("other", 2, 0, "cpu", 30)
    deadline = time.monotonic() + 10
    taken = []
    while not taken and time.monotonic() < deadline:  # the lease runs out after 0.2 s
        taken = store.claim(other, devices=0, seconds=100)
    assert [c.test_id for c in taken] == [claims[1].test_id]
    assert taken[0].token != claims[1].token
    assert not store.report(slow, claims[1], "passed", False)  # late: refused
    assert not store.heartbeat(slow)
    assert store.claim(slow, devices=0, seconds=100) == []
    assert store.report(other, taken[0], "failed", True)
    ended = {r.test_id: (r.state, r.outcome, r.gating) for r in store.tests()}
    assert ended == {
        claims[0].test_id: ("done", "passed", False),
        claims[1].test_id: ("done", "failed", True),
    }
    jobs = {job.host: job for job in store.jobs()}
    assert jobs["slow"].lost and not jobs["slow"].alive
    assert jobs["other"].alive and jobs["other"].done == 1


def test_heartbeat_keeps_the_lease(postgres: Server, store: QueueStore) -> None:
    store.publish(suite()[:1], "host")
    job = store.join("host", 1, 0, "cpu", 0.6)
    claims = store.claim(job, devices=0, seconds=1)
    beat = Heartbeat(postgres.url, store.run_id, job, 0.6)
    beat.start()
    try:
        other = store.join("other", 2, 0, "cpu", 30)
        until = time.monotonic() + 2.0  # three leases long: claims would have gone back
        while time.monotonic() < until:
            assert store.claim(other, devices=0, seconds=1) == []
        assert not beat.lost
    finally:
        beat.stop()
    assert store.report(job, claims[0], "passed", False)


def test_leave_gives_claims_back(store: QueueStore) -> None:
    store.publish(suite()[:3], "host")
    job = store.join("host", 1, 1, "sim", 30)
    claims = store.claim(job, devices=1, seconds=100)
    store.report(job, claims[0], "passed", False)
    assert store.leave(job) == 2
    assert [t.state for t in store.tests()] == ["queued", "done", "queued"]


def test_concurrent_claims_never_share_a_test(postgres: Server, store: QueueStore) -> None:
    store.publish([QueuedTest(f"t.py::t{i}", 0, "cpu", 0.1) for i in range(400)], "host")
    got: list[list[str]] = [[] for _ in range(4)]

    def worker(index: int) -> None:
        queue = QueueStore(postgres.url, store.run_id)
        job = queue.join(f"h{index}", index, 0, "cpu", 30)
        while claims := queue.claim(job, devices=0, seconds=0.5):
            for claim in claims:
                if queue.report(job, claim, "passed", False):
                    got[index].append(claim.test_id)
        queue.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    everything = [test for ids in got for test in ids]
    assert sorted(everything) == sorted(f"t.py::t{i}" for i in range(400))
    assert all(not thread.is_alive() for thread in threads)


def test_settle_ends_what_no_live_job_can_hold(store: QueueStore) -> None:
    store.publish(suite(), "host")
    two = store.join("small", 1, 2, "sim", 30)
    four = store.join("mid", 2, 4, "sim", 30)
    assert store.settle() == ["t.py::eight"]
    row = next(t for t in store.tests() if t.test_id == "t.py::eight")
    assert row.outcome == "infra" and row.gating and row.result is not None
    assert row.result["detail"] == (
        "unsatisfiable: it needs 8 devices and no live job of the run can hold it "
        "(joined: small (2 devices), mid (4 devices))"
    )
    store.leave(four)
    assert store.settle() == ["t.py::four"]
    store.leave(two)
    assert sorted(store.settle()) == ["t.py::cpu_a", "t.py::cpu_b", "t.py::one", "t.py::two"]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysql://127.0.0.1/db", "must be a PostgreSQL URL"),
        ("postgresql://devpool@127.0.0.1:1/postgres", "cannot reach PostgreSQL at 127.0.0.1:1"),
    ],
)
def test_bad_urls_one_sentence(postgres: Server, url: str, words: str) -> None:
    with pytest.raises(DevpoolError, match=words) as caught:
        connect(url)
    assert "\n" not in str(caught.value)


def test_missing_database_one_sentence(postgres: Server) -> None:
    url = postgres.url.rsplit("/", 1)[0] + "/nosuchdb"
    with pytest.raises(DevpoolError, match='database "nosuchdb" does not exist'):
        connect(url)


def test_wrong_credentials_one_sentence() -> None:
    message = (
        'connection failed: connection to server at "10.0.0.5", port 5433 failed: FATAL:  '
        'password authentication failed for user "ci"'
    )
    assert failure_sentence("postgresql://ci:secret@10.0.0.5:5433/q", message) == (
        "--devpool-queue: PostgreSQL at 10.0.0.5:5433 refused the credentials "
        '(password authentication failed for user "ci")'
    )


def test_without_the_extra_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    # No package index has devpool: the sentence says to install the extra from a clone.
    extra = r"pip install '/path/to/devpool\[queue\]' \(a clone of devpool's repository\)"
    with pytest.raises(DevpoolError, match=extra) as caught:
        connect("postgresql://127.0.0.1/db")
    assert "\n" not in str(caught.value)


def test_a_moved_rerun_goes_to_another_host_first(store: QueueStore) -> None:
    store.publish([QueuedTest("t.py::flaky", 2, "2 devices", 1.0)], "h1")
    failed_on = store.join("h1", 1, 2, "sim", 30)
    same_host = store.join("h1", 2, 4, "sim", 30)
    small = store.join("h2", 3, 1, "sim", 30)  # another host, too small to hold it
    other_host = store.join("h2", 4, 2, "sim", 30)
    (claim,) = store.claim(failed_on, devices=2, seconds=10)
    assert (claim.attempt, claim.spent, claim.earlier) == (1, (0, 0, 0), ())
    earlier = [{"attempt": 1, "outcome": "failed", "message": "m", "text": "t", "host": "h1"}]
    assert store.move(failed_on, claim, 2, (1, 0, 1), earlier)
    assert not store.move(failed_on, claim, 2, (1, 0, 1), earlier)  # no longer its claim
    # another job on the host it failed on, the job itself and a job too small wait
    assert store.claim(same_host, devices=4, seconds=10) == []
    assert store.claim(failed_on, devices=2, seconds=10) == []
    assert store.claim(small, devices=1, seconds=10) == []
    (rerun,) = store.claim(other_host, devices=2, seconds=10)
    assert (rerun.test_id, rerun.attempt, rerun.spent) == ("t.py::flaky", 2, (1, 0, 1))
    assert [dict(e) for e in rerun.earlier] == earlier
    # failed on h2 too, and h2's job gone: now h2 is the host avoided, h1's jobs may take it
    assert store.move(other_host, rerun, 3, (2, 0, 2), earlier * 2)
    store.leave(other_host)
    assert store.claim(failed_on, devices=2, seconds=10) != []
    (third,) = [t for t in store.tests() if t.test_id == "t.py::flaky"]
    assert third.state == "claimed" and third.job_id == failed_on


def test_a_rerun_stays_when_no_other_job_can_hold_it(store: QueueStore) -> None:
    store.publish([QueuedTest("t.py::big", 4, "4 devices", 1.0)], "h1")
    alone = store.join("h1", 1, 4, "sim", 30)
    store.join("h2", 2, 2, "sim", 30)  # alive, but too small
    (claim,) = store.claim(alone, devices=4, seconds=10)
    assert not store.move(alone, claim, 2, (1, 0, 1), [])
    (row,) = store.tests()
    assert (row.state, row.job_id) == ("claimed", alone)


def test_a_chain_is_claimed_whole_by_the_job_that_takes_its_first_test(
    postgres: Server, store: QueueStore
) -> None:
    chain = [QueuedTest(f"t.py::step{i}", 0, "cpu", 1.0, "t.py::step0") for i in range(3)]
    store.publish([QueuedTest("t.py::long", 0, "cpu", 9.0), *chain], "h")
    first = store.join("h", 1, 0, "sim", 30)
    second = store.join("h", 2, 0, "sim", 30)
    # a batch of one test's worth: the longest test, and never a chain's later test alone
    assert [c.test_id for c in store.claim(first, 0, 1.0)] == ["t.py::long"]
    steps = store.claim(second, 0, 1.0)
    assert [c.test_id for c in steps] == [f"t.py::step{i}" for i in range(3)]
    assert store.claim(first, 0, 100) == []
    # the first step ended; the second job was lost: the rest come back, claimable alone
    assert store.report_many(second, [(steps[0], "passed", False, {})]) == []
    assert store.leave(second) == 2
    assert [c.test_id for c in store.claim(first, 0, 0.5)] == ["t.py::step1"]


def test_a_shuffled_collection_joins_a_chain_that_differs_does_not(
    postgres: Server, store: QueueStore
) -> None:
    store.publish(suite(), "host-a")
    other = QueueStore(postgres.url, store.run_id)
    try:  # pytest-randomly orders each job's collection its own way: the same tests
        assert other.publish(list(reversed(suite())), "host-b") is False
        chained = [QueuedTest(t.test_id, t.devices, t.request, t.estimate, "t.py::cpu_a")
                   for t in suite()]  # fmt: skip
        with pytest.raises(DevpoolError, match="other pytest-order or pytest-dependency chains"):
            other.publish(chained, "host-c")
    finally:
        other.close()


def test_a_moved_rerun_nobody_takes_comes_back_after_a_lease(store: QueueStore) -> None:
    store.publish([QueuedTest("t.py::flaky", 1, "1 device", 1.0)], "h1")
    failed_on = store.join("h1", 1, 1, "sim", 30)
    store.join("h2", 2, 1, "sim", 30)  # alive, but it never claims (its plan skips the test)
    (claim,) = store.claim(failed_on, devices=1, seconds=10)
    assert store.move(failed_on, claim, 2, (1, 0, 1), [])
    assert store.claim(failed_on, devices=1, seconds=10) == []
    store.db.execute(  # a lease of the job that asks (30 s) has passed since the move
        "UPDATE devpool_queue_tests SET moved_at = now() - interval '31 seconds' WHERE run_id = %s",
        (store.run_id,),
    )
    assert [c.test_id for c in store.claim(failed_on, devices=1, seconds=10)] == ["t.py::flaky"]


def test_guided_claims_shrink_as_the_run_drains(store: QueueStore) -> None:
    store.publish([QueuedTest(f"t.py::t{i:02d}", 0, "cpu", 1.0) for i in range(40)], "h")
    jobs = [store.join("h", pid, 0, "sim", 30) for pid in (1, 2)]
    sizes = []
    while claims := store.claim(jobs[len(sizes) % 2], 0, seconds=100, guide=True):
        sizes.append(len(claims))
    # each claim a quarter of what is left (1 / (TAIL x 2 live jobs)), one test at the end
    assert sizes[:4] == [10, 8, 6, 4] and sizes[-3:] == [1, 1, 1] and sum(sizes) == 40
    assert store.claim(jobs[0], 0, seconds=100) == []
