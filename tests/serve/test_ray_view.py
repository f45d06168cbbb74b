"""The host page's Ray view, in headless Chromium, on a real two-node loopback cluster:
each node with its devices and devpool's actor on it with the run and test it serves, as
Ray's own state API tells them; and a cluster that does not answer, said in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import Project, Server, Session, free_port, wait_for

from devpool.backends.ray.names import ActorName
from docs_screenshots import keep_for_docs
from ray_nodes import Cluster, two_node_cluster

HELD = "test_small.py::test_small"  # holds 2 devices until released (serving.TESTS)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two nodes of 4 NPU each; the head serves Ray's dashboard and so its state API."""
    with two_node_cluster(dashboard=True) as started:
        yield started


def _on_ray(project: Project, address: str) -> None:
    """The project runs on the cluster from its own [tool.devpool] table, as a team would."""
    pyproject = project.root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + f'\n[tool.devpool]\nbackend = "ray"\nray-address = "{address}"\n'
        '\n[tool.devpool.platforms]\nsim = { kind = "sim", ray-resource = "NPU" }\n'
    )


def _shown(page: Any, selector: str, attribute: str) -> list[str]:
    return sorted(e.get_attribute(attribute) for e in page.locator(selector).all())


def test_each_node_and_the_actor_serving_a_held_test_as_rays_state_api_says(
    browser: Any,
    project: Project,
    serve: Callable[..., Server],
    sessions: Callable[..., Session],
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    from ray.util import state

    _on_ray(project, cluster.address)
    server = serve()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.url + "/")
    # Configured in the project: the cluster shows before any run, its nodes idle.
    page.locator("#ray .ray-node[data-state=ALIVE] >> nth=1").wait_for(timeout=30000)
    assert page.locator("#ray .ray-actor").count() == 0

    run = sessions("ray", "--devices=sim", "test_small.py")
    wait_for(lambda: (project.flags / "small.started").exists(), "the test to hold", 120)
    actor_box = page.locator(f'#ray .ray-actor[data-test="{HELD}"]')
    actor_box.wait_for(timeout=10000)
    page.screenshot(path=str(tmp_path / "ray-holding.png"), full_page=True)

    # What Ray itself says, asked here: the view's nodes and actor are those.
    nodes = {n.node_id: n for n in state.list_nodes(address=cluster.address)}
    actors = state.list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")])
    ours = [a for a in actors if ActorName.parse(a.name) is not None]
    assert len(ours) == 1, actors
    actor = ours[0]
    live = server.json("/api/v1/runs/live")["runs"]
    assert ActorName.parse(actor.name).run_id == live[0]["run"]

    view = server.json("/api/v1/ray")
    assert view["schema"] == 1 and len(view["clusters"]) == 1
    shown = view["clusters"][0]
    assert shown["address"] == cluster.address and shown["problem"] is None
    assert shown["why"] == ["project proj: backend = ray", f"live run {live[0]['run']}"]
    assert {n["node_id"] for n in shown["nodes"]} == set(nodes)
    assert [n["head"] for n in shown["nodes"]] == [True, False]
    holding = [n for n in shown["nodes"] if n["actors"]]
    assert [n["node_id"] for n in holding] == [actor.node_id]
    assert holding[0]["resources"]["NPU"] == {"total": 4.0, "devpool": 2.0}
    served = holding[0]["actors"][0]
    assert served["actor_id"] == actor.actor_id and served["pid"] == actor.pid
    assert (served["test"], served["run"], served["rank"]) == (HELD, live[0]["run"], 0)

    # The cluster's devices are not this host's: the Devices section lists none of them.
    assert page.locator("#devices .device").count() == 0
    # The page shows what the JSON says.
    assert _shown(page, "#ray .ray-node", "data-node") == sorted(nodes)
    box = page.locator(f'#ray .ray-node[data-node="{actor.node_id}"] .ray-actor')
    assert box.get_attribute("data-actor") == actor.actor_id
    assert HELD in box.inner_text() and "NPU 2" in box.inner_text()

    run.release()
    assert run.wait() == 0, run.output()
    # The actor leaves with its run; the configured cluster and its nodes stay.
    actor_box.wait_for(state="detached", timeout=15000)
    assert page.locator("#ray .ray-node").count() == 2
    assert server.json("/api/v1/ray")["clusters"][0]["why"] == ["project proj: backend = ray"]
    page.screenshot(path=str(tmp_path / "ray-after.png"), full_page=True)


WAITING_RUN = """
import sys, time
import ray
ray.init(address=sys.argv[1], namespace="devpool")
from devpool.backends.ray.waiting import ClusterWaitingRoom
from devpool.devices.waiting_room import Waiter
room = ClusterWaitingRoom("20261202-101500-4242")
waiter = Waiter("20261202-101500-4242", 4242, "ci-runner-7", "sim", time.time() - 30, 4)
print("waiting", flush=True)
while True:  # as a waiting run does: its key renewed every few seconds
    room.wait(waiter)
    time.sleep(0.5)
"""


def test_a_run_waiting_for_its_share_shows_as_the_clusters_store_says(
    browser: Any, project: Project, serve: Callable[..., Server], cluster: Cluster
) -> None:
    """A run that waits on the cluster for a fair share (its key in the cluster's key-value
    store, written by the waiting room itself) is on the page, read without joining."""
    _on_ray(project, cluster.address)
    waiting = subprocess.Popen(
        [sys.executable, "-c", WAITING_RUN, cluster.address],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert waiting.stdout is not None and waiting.stdout.readline() == "waiting\n"
        server = serve()
        page = browser.new_page()
        page.goto(server.url + "/")
        shown = page.locator('#ray .ray-waiting[data-run="20261202-101500-4242"]')
        shown.wait_for(timeout=30000)
        text = shown.inner_text()
        assert "pid 4242 on ci-runner-7" in text and "its next job needs 4 sim" in text, text
        (view,) = server.json("/api/v1/ray")["clusters"]
        (said,) = view["waiting"]
        assert {k: v for k, v in said.items() if k != "since"} == {
            "session": "20261202-101500-4242",
            "pid": 4242,
            "host": "ci-runner-7",
            "platform": "sim",
            "wants": 4,
        }
    finally:
        os.killpg(waiting.pid, signal.SIGKILL)
        waiting.wait()


def test_a_cluster_that_does_not_answer_is_one_line_and_the_page_stays(
    browser: Any, serve: Callable[..., Server]
) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    server = serve(f"--ray-address={nobody}")
    page = browser.new_page()
    page.goto(server.url + "/")
    assert page.locator("#devices").is_visible()  # the page never waits for Ray
    problem = page.locator(".ray-problem")
    problem.wait_for(timeout=10000)
    text = problem.inner_text()
    assert text.startswith(f"Ray's state API at {nobody} did not answer: ") and "\n" not in text
    assert server.json("/api/v1/ray")["clusters"][0]["problem"] == text
    assert "Traceback" not in server.log.read_text(errors="replace")


def test_a_two_node_test_shows_a_rank_on_each_node_and_its_devices(
    browser: Any,
    project: Project,
    serve: Callable[..., Server],
    sessions: Callable[..., Session],
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    _on_ray(project, cluster.address)
    (project.root / "test_pair.py").write_text(
        (project.root / "test_small.py").read_text().split("@pytest.mark", 1)[0]
        + "\n\n@pytest.mark.nodes(2)\n@pytest.mark.device_count(3)\n"
        "def test_pair(devpool_node):\n    hold(f'pair-{devpool_node.rank}')\n"
    )
    server = serve()
    page = browser.new_page(viewport={"width": 1300, "height": 700})
    page.goto(server.url + "/")
    run = sessions("pair", "--devices=sim", "test_pair.py")
    wait_for(
        lambda: all((project.flags / f"pair-{r}.started").exists() for r in (0, 1)),
        "both ranks to hold",
        120,
    )
    pair = "test_pair.py::test_pair"
    wait_for(lambda: page.locator(f'#ray .ray-actor[data-test="{pair}"]').count() == 2, "2", 10)
    nodes = server.json("/api/v1/ray")["clusters"][0]["nodes"]
    # One rank on each node (STRICT_SPREAD), each holding 3 of its 4 NPU: Ray's placement
    # group names (NPU_group_0_<id>) are counted as the node's NPU.
    assert [sorted(a["rank"] for a in n["actors"]) for n in nodes] in ([[0], [1]], [[1], [0]])
    assert [n["resources"]["NPU"] for n in nodes] == [{"total": 4.0, "devpool": 3.0}] * 2
    assert {a["test"] for n in nodes for a in n["actors"]} == {pair}
    assert all(not name.count("_group_") for n in nodes for name in n["resources"])
    page.locator("#live").scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "ray-pair.png"), full_page=True)
    page.locator("#ray").screenshot(path=str(tmp_path / "ray-section.png"))
    keep_for_docs(tmp_path / "ray-section.png", "host-page-ray.png")  # docs/host-page.md
    run.release()
    assert run.wait() == 0, run.output()
    page.locator("#ray .ray-actor").first.wait_for(state="detached", timeout=15000)


def test_a_dashboard_url_is_read_over_http_without_loading_ray(
    serve: Callable[..., Server], cluster: Cluster
) -> None:
    from ray.util import state

    dashboard = "http://" + cluster.head_node.address_info["webui_url"]
    server = serve(f"--ray-address={dashboard}")
    view = wait_for(
        lambda: (v := server.json("/api/v1/ray")["clusters"][0])["nodes"] and v,
        "the Ray view to answer",
        30,
    )
    assert view["address"] == dashboard and view["problem"] is None
    expected = {n.node_id: n.is_head_node for n in state.list_nodes(address=cluster.address)}
    assert {n["node_id"]: n["head"] for n in view["nodes"]} == expected
    assert [n["resources"]["NPU"]["total"] for n in view["nodes"]] == [4.0, 4.0]
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "_raylet" not in maps  # Ray's client (and its ~57 MB) never loaded

    # A URL that is no dashboard is one line too.
    other = serve(f"--ray-address={server.url}")
    problem = wait_for(
        lambda: other.json("/api/v1/ray")["clusters"][0]["problem"], "a problem line", 30
    )
    assert problem == f"Ray's state API at {server.url} did not answer: HTTP 404"
