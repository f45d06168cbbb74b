"""run/again.py: why a test runs again, as one decision table, and its bounds over any
sequence of endings (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devpool.config import Settings
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.run.again import (
    ALONE_AFTER,
    NO,
    Decision,
    Facts,
    Happened,
    Limits,
    Why,
    ask,
    budget,
    decide,
)
from devpool.run.attempts import Attempt

F, E, T, C, INF = Outcome.FAILED, Outcome.ERROR, Outcome.TIMEOUT, Outcome.CRASHED, Outcome.INFRA
RERUN = Decision(Why.RERUN, spends="failed", own_failure=True)
RERUN_INFRA = Decision(Why.RERUN_INFRA, spends="infra", own_failure=True)
MEMORY = Decision(Why.MEMORY, whole_device=True)
ONE = Limits(reruns=1, reruns_infra=1)
NONE = Limits(reruns=0, reruns_infra=0)

# (facts, limits, decision): every reason a test runs again, and where it does not.
TABLE = [
    # its own failure or error spends --devpool-reruns; none left: it does not run again
    (Facts(Happened.FAILED_REPORT, F, started=True), NONE, NO),
    (Facts(Happened.FAILED_REPORT, F, started=True), ONE, RERUN),
    (Facts(Happened.FAILED_REPORT, E, started=True, spent_failed=1), ONE, NO),
    # its own reruns marker wins over the option, either way
    (Facts(Happened.FAILED_REPORT, E, started=True, own_reruns=2, spent_failed=1), ONE, RERUN),
    (Facts(Happened.FAILED_REPORT, F, started=True, own_reruns=0), ONE, NO),
    # once a report said RERUN, its later failed reports say so too, left reruns or not
    (Facts(Happened.FAILED_REPORT, E, RERUN, started=True, spent_failed=9), ONE, RERUN),
    (Facts(Happened.FAILED_REPORT, E, MEMORY, started=True), NONE, MEMORY),
    # out of memory beside others: once more alone on a whole device, spending nothing
    (Facts(Happened.RAN_OUT_BESIDE, F, started=True, spent_failed=5), NONE, MEMORY),
    # finished: what its reports decided, with the reruns delay of a failure
    (Facts(Happened.FINISHED, F, NO, started=True), ONE, NO),
    (Facts(Happened.FINISHED, F, RERUN, started=True), replace(ONE, reruns_delay=0.5),
     replace(RERUN, delay=0.5)),
    (Facts(Happened.FINISHED, F, RERUN, started=True, own_delay=0.0),
     replace(ONE, reruns_delay=0.5), RERUN),
    (Facts(Happened.FINISHED, F, MEMORY, started=True), replace(ONE, reruns_delay=0.5),
     replace(MEMORY, delay=0.5)),
    # a timeout is the test's own failure: --devpool-reruns, delayed
    (Facts(Happened.ENDED, T, started=True), replace(ONE, reruns_delay=2.0),
     replace(RERUN, delay=2.0)),
    (Facts(Happened.ENDED, T, started=True), NONE, NO),
    # a crash is its own too, under --devpool-reruns-infra, at once
    (Facts(Happened.ENDED, C, started=True), replace(ONE, reruns_delay=2.0), RERUN_INFRA),
    (Facts(Happened.ENDED, C, started=True, spent_infra=1), ONE, NO),
    # infra (a machine lost, a worker that died before it, not collected): not its own
    (Facts(Happened.ENDED, INF, started=True), ONE, replace(RERUN_INFRA, own_failure=False)),
    (Facts(Happened.ENDED, INF), ONE, replace(RERUN_INFRA, own_failure=False)),
    (Facts(Happened.ENDED, C), ONE, replace(RERUN_INFRA, own_failure=False)),
    # an ending decides afresh: a crash after a failed report spends a crash's rerun
    (Facts(Happened.ENDED, C, RERUN, started=True), replace(ONE, reruns_infra=0), NO),
    (Facts(Happened.ENDED, C, MEMORY, started=True), ONE, MEMORY),
    # the ending of a memory overrun is a failure of its own
    (Facts(Happened.ENDED, F, started=True), ONE, RERUN),
    # sent back untouched: the same attempt; too often, in a worker of its own
    (Facts(Happened.SENT_BACK), NONE, Decision(Why.SENT_BACK)),
    (Facts(Happened.SENT_BACK, requeues=ALONE_AFTER - 1), NONE,
     Decision(Why.SENT_BACK, own_worker=True)),
    (Facts(Happened.SENT_BACK, requeues=ALONE_AFTER - 1, counts=False), NONE,
     Decision(Why.SENT_BACK)),  # a fair-share cut is never held against it
    (Facts(Happened.SENT_BACK, requeues=ALONE_AFTER, runs_alone=True), NONE, NO),
    (Facts(Happened.SENT_BACK, requeues=ALONE_AFTER, runs_alone=True, counts=False), NONE,
     Decision(Why.SENT_BACK, own_worker=True)),
    # after the loop, without its one ending (a devpool bug): it ends here
    (Facts(Happened.LOST_TRACK, INF, RERUN, started=True), ONE, NO),
]  # fmt: skip


@pytest.mark.parametrize(("facts", "limits", "expected"), TABLE)
def test_the_decision_table(facts: Facts, limits: Limits, expected: Decision) -> None:
    assert decide(facts, limits) == expected


def test_what_a_decision_says_of_its_attempt_and_queue() -> None:
    assert RERUN.new_attempt and RERUN.movable and RERUN_INFRA.movable
    assert MEMORY.new_attempt and not MEMORY.movable  # not its doing: it stays in this job
    sent_back = Decision(Why.SENT_BACK)
    assert sent_back.runs and not sent_back.new_attempt and not sent_back.movable
    assert not NO.runs and not NO.new_attempt


def test_the_budget_said_in_the_reports() -> None:
    limits = Limits(reruns=2, reruns_infra=3)
    assert budget(F, None, limits) == ("--devpool-reruns", 2)
    assert budget(T, 4, limits) == ("its own reruns", 4)
    assert budget(C, 4, limits) == ("--devpool-reruns-infra", 3)
    assert budget(INF, None, limits) == ("--devpool-reruns-infra", 3)


def _attempt(reruns: int | None = None) -> Attempt:
    job = Job(1, "t.py::test_a", ("t.py", 1, "test_a"), Request(1, reruns=reruns), 0)
    return Attempt(job, 1)


def test_ask_keeps_the_decision_on_the_attempt_but_not_a_send_back() -> None:
    settings = Settings(None, {}, reruns=1)
    attempt = _attempt()
    attempt.started_wall = 1.0
    assert ask(attempt, Happened.FAILED_REPORT, settings, F) == RERUN
    assert attempt.again == RERUN
    assert ask(attempt, Happened.SENT_BACK, settings).why is Why.SENT_BACK
    assert attempt.again == RERUN  # a send-back leaves the attempt as it was
    assert ask(attempt, Happened.LOST_TRACK, settings) == NO and attempt.again == NO


ENDINGS = st.sampled_from([F, E, T, C, INF])


@given(
    reruns=st.integers(0, 3),
    reruns_infra=st.integers(0, 3),
    own=st.none() | st.integers(0, 3),
    endings=st.lists(st.tuples(ENDINGS, st.booleans()), min_size=1, max_size=12),
)
def test_a_test_that_never_passes_runs_again_only_within_its_reruns(
    reruns: int, reruns_infra: int, own: int | None, endings: list[tuple[Outcome, bool]]
) -> None:
    """Each attempt fails with any ending: the job runs again until its reruns are spent,
    each rerun spends one of the ending's own kind, and only a started test's own ending
    counts towards flaky."""
    settings = Settings(None, {}, reruns=reruns, reruns_infra=reruns_infra)
    job = _attempt(own).job
    limit = reruns if own is None else own
    attempts = 0
    for outcome, started in endings:
        attempts += 1
        attempt = Attempt(job, attempts)
        attempt.started_wall = 1.0 if started else 0.0
        infra = outcome in (C, INF)
        left = job.retries_infra < reruns_infra if infra else job.retries_failed < limit
        decision = ask(attempt, Happened.ENDED, settings, outcome)
        assert decision.runs == left
        if not decision.runs:
            break
        assert decision.spends == ("infra" if infra else "failed")
        assert decision.own_failure == (started and outcome is not INF)
        job.retries_infra += decision.spends == "infra"
        job.retries_failed += decision.spends == "failed"
    assert attempts <= 1 + limit + reruns_infra
    assert job.retries_failed <= limit and job.retries_infra <= reruns_infra


@given(counts=st.lists(st.booleans(), min_size=1, max_size=20))
def test_a_test_sent_back_again_and_again_ends_as_its_own(counts: list[bool]) -> None:
    """Sent back ALONE_AFTER times, held against it, it runs next in a worker of its own;
    sent back from there, it goes back no more (its ending is its own). A fair-share cut
    never moves it closer to that."""
    settings = Settings(None, {})
    attempt = _attempt()
    held = 0
    for count in counts:
        decision = ask(attempt, Happened.SENT_BACK, settings, counts=count)
        if not decision.runs:
            assert count and attempt.job.runs_alone and held >= ALONE_AFTER
            return
        assert decision.why is Why.SENT_BACK and not decision.spends
        attempt.requeues += count  # as Attempt.requeue and Endings.requeue do
        held += count
        if decision.own_worker:
            attempt.job.runs_alone = True
        assert attempt.job.runs_alone == (held >= ALONE_AFTER)
    assert held <= ALONE_AFTER or not attempt.job.runs_alone
