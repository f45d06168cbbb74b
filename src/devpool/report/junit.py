"""JUnit XML as plain pytest writes it, with retried attempts folded as cargo-nextest does.

pytest's --junitxml writes one <testcase> per attempt, in the order reports arrive (the order
tests ended, under devpool). After it has written the file, each earlier attempt becomes a
child of the final testcase: <flakyFailure>/<flakyError> when the test passed in the end,
<rerunFailure>/<rerunError> when it did not; and the testcases go back into collection order,
the order plain pytest writes them in.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EarlierAttempt:
    """A failed attempt that was run again."""

    attempt: int
    outcome: str  # failed, error, timeout, crashed, infra
    message: str
    text: str


def _attempt_of(case: ET.Element) -> int:
    for prop in case.iter("property"):
        if prop.get("name") == "devpool.attempt":
            return int(prop.get("value", "1"))
    return 1


def add_attempt(final: ET.Element, attempt: EarlierAttempt, passed: bool) -> None:
    """An earlier attempt as a child of the test's final case: <flakyFailure>/<flakyError>
    when the test passed in the end, <rerunFailure>/<rerunError> when it did not."""
    kind = "Error" if attempt.outcome == "error" else "Failure"
    tag = ("flaky" if passed else "rerun") + kind
    child = ET.SubElement(final, tag, message=attempt.message[:500], type=attempt.outcome)
    child.text = attempt.text


def fold_attempts(
    path: Path,
    attempts: Mapping[tuple[str, str], Sequence[EarlierAttempt]],
    order: Sequence[tuple[str, str]] = (),
) -> int:
    """Rewrite the file in place; attempts are keyed by (classname, name), `order` lists those
    keys in collection order (testcases not in it keep their place after the ones that are).
    Returns the folds made."""
    tree = ET.parse(path)
    folds = 0
    rank = {key: index for index, key in enumerate(order)}
    for suite in tree.iter("testsuite"):
        by_name: dict[tuple[str, str], list[ET.Element]] = {}
        for case in suite.findall("testcase"):
            key = (case.get("classname", ""), case.get("name", ""))
            by_name.setdefault(key, []).append(case)
        for key, cases in by_name.items():
            earlier = attempts.get(key)
            if len(cases) < 2 or not earlier:
                continue
            cases.sort(key=_attempt_of)
            final = cases[-1]
            passed = final.find("failure") is None and final.find("error") is None
            for case in cases[:-1]:
                suite.remove(case)
            for attempt in earlier:
                add_attempt(final, attempt, passed)
                folds += 1
        if rank:
            cases = suite.findall("testcase")
            for case in cases:
                suite.remove(case)
            cases.sort(
                key=lambda c: rank.get((c.get("classname", ""), c.get("name", "")), len(rank))
            )
            suite.extend(cases)
    # pytest's own declaration (double quotes), not ElementTree's
    body = ET.tostring(tree.getroot(), encoding="unicode")
    path.write_text('<?xml version="1.0" encoding="utf-8"?>' + body, encoding="utf-8")
    return folds
