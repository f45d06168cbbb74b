"""Unit tests for devpool.worker.capture: where a worker's captured output lives, read back."""

from __future__ import annotations

from pathlib import Path

from devpool.worker.capture import crash_output, output_file, remove_empty, worker_base


def test_only_a_worker_with_a_stacks_file_names_its_capture_files(tmp_path: Path) -> None:
    stacks = tmp_path / "worker-3.stacks"
    env = {"DEVPOOL_STACKS_FILE": str(stacks)}

    assert worker_base(["tests", "--devpool-worker", "5,6,7"], env) == stacks
    assert worker_base(["--devpool-worker=5,6,7"], env) == stacks
    assert worker_base(["tests"], env) is None
    assert worker_base(["--devpool-worker", "5,6,7"], {}) is None
    # Named after the worker log, as the stacks file is.
    assert output_file(stacks, "stdout") == output_file(tmp_path / "worker-3.log", "stdout")


def test_crash_output_labels_the_last_lines_of_each_stream(tmp_path: Path) -> None:
    log = tmp_path / "worker-1.log"
    output_file(log, "stdout").write_text("".join(f"line {i}\n" for i in range(100)))
    output_file(log, "stderr").write_text("Traceback ...\n")

    text = crash_output(log, lines=3).splitlines()

    assert text == [
        "---- stdout of the test until the worker ended (last 3 lines, worker-1.stdout) ----",
        "line 97",
        "line 98",
        "line 99",
        "---- stderr of the test until the worker ended (last line, worker-1.stderr) ----",
        "Traceback ...",
    ]


def test_no_output_files_or_empty_ones_give_no_text(tmp_path: Path) -> None:
    log = tmp_path / "worker-2.log"
    assert crash_output(log) == ""
    output_file(log, "stdout").write_text("")
    assert crash_output(log) == ""


def test_remove_empty_keeps_files_with_output(tmp_path: Path) -> None:
    log = tmp_path / "worker-4.log"
    output_file(log, "stdout").write_text("")
    output_file(log, "stderr").write_text("kept\n")

    remove_empty(log)

    assert not output_file(log, "stdout").exists()
    assert output_file(log, "stderr").read_text() == "kept\n"
