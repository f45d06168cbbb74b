"""JUnit XML: fold a test's retried attempts into its final testcase, as cargo-nextest does.

pytest's --junitxml writes one <testcase> per attempt. After it has written the file,
each earlier attempt becomes a child of the final testcase: <flakyFailure>/<flakyError>
when the test passed in the end, <rerunFailure>/<rerunError> when it did not.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Attempt:
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


def fold_attempts(path: Path, attempts: Mapping[tuple[str, str], Sequence[Attempt]]) -> int:
    """Rewrite the file in place; attempts are keyed by (classname, name). Returns folds made."""
    tree = ET.parse(path)
    folds = 0
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
                kind = "Error" if attempt.outcome == "error" else "Failure"
                tag = ("flaky" if passed else "rerun") + kind
                child = ET.SubElement(
                    final, tag, message=attempt.message[:500], type=attempt.outcome
                )
                child.text = attempt.text
                folds += 1
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return folds
