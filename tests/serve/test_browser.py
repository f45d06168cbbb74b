"""The host page in headless Chromium, against a real `devpool serve` and real sessions."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving import HOSTILE, Project, Server, Session, wait_for

from docs_screenshots import keep_for_docs


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    """A page at the URL, and the list of every dialog it opens (an XSS would open one)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(url)
    return page, dialogs


def _fits(page: Any, tmp_path: Path, name: str) -> None:
    """At 1400 and 800 px the page needs no sideways scroll (log names and test ids wrap, at
    their separators: no element is wider than the window)."""
    for width in (1400, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= width, (name, width)
    page.set_viewport_size({"width": 1400, "height": 900})


def _holders(page: Any) -> dict[str, list[str]]:
    """Each device box's name → the test ids its holders show, as the page renders them."""
    shown: dict[str, list[str]] = {}
    for box in page.locator(".device").all():
        tests = [t.text_content() for t in box.locator(".holder .test").all()]
        shown[box.get_attribute("data-device")] = tests
    return shown


def test_a_run_holding_devices_appears_within_2s_and_leaves_when_it_ends(
    browser: Any,
    project: Project,
    serve: Callable[..., Server],
    sessions: Callable[..., Session],
    tmp_path: Path,
) -> None:
    server = serve()
    page, dialogs = _open(browser, server.url + "/")
    assert page.locator("#devices").is_visible()
    page.locator("#live-state", has_text="live").wait_for(timeout=5000)  # /events is open
    run = sessions("hold", "--devices", "sim:0-3", "test_hold.py")
    wait_for(
        lambda: all((project.flags / f"{n}.started").exists() for n in ("hostile", "plain")),
        "both tests to hold their devices",
        90,
    )
    held_at = time.monotonic()
    hostile_id = f"test_hold.py::test_hostile[{HOSTILE}]"
    # The page updates itself (server-sent events), no reload: within 2 s of the tests
    # holding their devices it names both test ids on their devices.
    page.locator(".device .test", has_text=HOSTILE).first.wait_for(timeout=2000)
    page.locator(".device .test", has_text="test_hold.py::test_plain").wait_for(timeout=2000)
    assert time.monotonic() - held_at < 2.5
    page.screenshot(path=str(tmp_path / "holding.png"), full_page=True)
    _fits(page, tmp_path, "holding")
    held = page.locator(".device[data-state=held]").first
    # Held is a busy host's normal state: a calm colour, not the red of failures.
    assert held.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(21, 101, 192)"

    # The hostile id is text: no dialog, no <img> made of it, the exact text on the page.
    assert dialogs == []
    assert page.locator("img").count() == 0
    holders = _holders(page)
    assert sorted(t for tests in holders.values() for t in tests) == sorted(
        [hostile_id, hostile_id, "test_hold.py::test_plain"]
    )
    assert page.locator("#live .live-run").count() == 1

    # The JSON says what the page shows.
    api = server.json("/api/v1/devices")
    assert api["schema"] == 1
    from_api = {d["name"]: [h["test"] for h in d["holders"]] for d in api["devices"]}
    assert from_api == holders
    states = {d["name"]: d["state"] for d in api["devices"]}
    shown = {
        box.get_attribute("data-device"): box.get_attribute("data-state")
        for box in page.locator(".device").all()
    }
    assert shown == states and sorted(states.values()) == ["free", "held", "held", "held"]
    live = server.json("/api/v1/runs/live")
    assert [r["run"] for r in live["runs"]] == [
        row.get_attribute("data-run") for row in page.locator("#live .live-run").all()
    ]
    assert live["runs"][0]["running"] == 2 and live["runs"][0]["tests"] == 2

    run.release()
    assert run.wait() == 0, run.output()
    # It leaves: every device free, no live run, the run among the recent ones.
    wait_for(lambda: page.locator(".device[data-state=held]").count() == 0, "devices free", 10)
    page.locator("#live", has_text="No run is in progress").wait_for(timeout=10000)
    page.locator("#recent .recent-run").first.wait_for(timeout=5000)
    assert dialogs == []
    page.screenshot(path=str(tmp_path / "after.png"), full_page=True)
    _fits(page, tmp_path, "after")
    recent = server.json("/api/v1/runs/recent")["runs"]
    assert recent[0]["counts"] == {"passed": 2} and recent[0]["ending"] == "passed (exit 0)"

    # Its HTML report and logs are reachable from the page; nothing outside the run folder.
    page.locator("#recent a", has_text="HTML report").first.click()
    page.wait_for_load_state()
    assert "devpool run" in page.title()
    assert dialogs == []
    status, _ = server.get(recent[0]["report"].replace("report.html", "files/../../../x"))
    assert status == 404


def test_a_waiting_run_shows_what_it_waits_for(
    browser: Any,
    project: Project,
    serve: Callable[..., Server],
    sessions: Callable[..., Session],
    tmp_path: Path,
) -> None:
    server = serve()
    first = sessions("big", "--devices", "sim:0-3", "test_big.py")
    wait_for(lambda: (project.flags / "big.started").exists(), "the big test to hold", 90)
    page, dialogs = _open(browser, server.url + "/")
    second = sessions("small", "--devices", "sim:0-3", "test_small.py")
    waiter = page.locator("#waiting .waiter")
    waiter.wait_for(timeout=60000)
    text = waiter.inner_text()
    assert "2 sim device(s) of 4" in text, text
    assert "sim:0, sim:1, sim:2, sim:3" in text, text
    waiting_row = page.locator(f"#live .live-run[data-run='{waiter.get_attribute('data-run')}']")
    assert "waiting for 2 sim device(s)" in waiting_row.inner_text()
    page.screenshot(path=str(tmp_path / "waiting.png"), full_page=True)
    api = server.json("/api/v1/waiting")["waiting"]
    assert [w["run"] for w in api] == [waiter.get_attribute("data-run")]
    assert api[0]["wants"] == 2 and api[0]["pool"] == 4
    keep_for_docs(tmp_path / "waiting.png", "host-page.png")  # docs/host-page.md

    first.release()
    wait_for(lambda: (project.flags / "small.started").exists(), "the small test to start", 60)
    page.locator("#waiting", has_text="No run is waiting").wait_for(timeout=10000)
    second.release()
    assert first.wait() == 0, first.output()
    assert second.wait() == 0, second.output()
    assert dialogs == []


def test_the_token_is_enforced(browser: Any, serve: Callable[..., Server]) -> None:
    server = serve(token="s3cret-token")
    assert server.get("/")[0] == 401
    assert server.get("/api/v1/devices")[0] == 401
    assert server.get("/", {"Authorization": "Bearer wrong"})[0] == 401
    assert server.get("/?token=wrong")[0] == 401
    assert server.get("/", {"Authorization": "Bearer s3cret-token"})[0] == 200
    assert server.get("/api/v1/devices?token=s3cret-token")[0] == 200
    page, _ = _open(browser, server.url + "/?token=s3cret-token")
    assert page.locator("#devices").is_visible()
    # The first page set a cookie: the page's own requests (events, refresh) need no query.
    status = page.evaluate("fetch('/api/v1/devices').then(r => r.status)")
    assert status == 200
    other = browser.new_page()
    answer = other.goto(server.url + "/")
    assert answer.status == 401


def test_without_a_token_only_loopback_names_are_answered(serve: Callable[..., Server]) -> None:
    server = serve()
    assert server.get("/")[0] == 200
    assert server.get("/", {"Host": "localhost:1"})[0] == 200
    # A page elsewhere whose DNS name was rebound to 127.0.0.1 gets nothing.
    assert server.get("/api/v1/devices", {"Host": "rebound.example:8470"})[0] == 403
    status, body = server.get("/", {"Host": "127.0.0.1"})
    assert status == 200 and b"devpool" in body
    request = urllib.request.Request(server.url + "/", method="POST")
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as error:
        assert error.code == 405
    else:
        raise AssertionError("a POST was answered")
