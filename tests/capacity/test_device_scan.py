"""capacity/device_scan.py: the line that suggests a test uses a device, or none."""

from __future__ import annotations

from pathlib import Path

from devpool.capacity.device_scan import scan

MODULE = """
import torch

DEVICE = "cpu"


@pytest.fixture
def model():
    return Net().cuda()


def test_uses_the_fixture(model):
    assert model


def test_counts():
    # torch.cuda.is_available() in a comment is no use
    assert torch.cuda.device_count() >= 0


class TestNpu:
    def test_npu(self):
        import torch_npu


def test_to_a_fixture(device):
    x = make().to(device)


def test_to_a_local():
    device = "cpu"
    x = make().to(device)
"""


def test_each_device_api_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "test_m.py"
    path.write_text(MODULE)

    def seen(name: str) -> tuple[int, str, str] | None:
        found = scan(f"test_m.py::{name}", path)
        return None if found is None else (found.line, found.api, found.text)

    assert seen("test_counts") == (18, "torch.cuda", "assert torch.cuda.device_count() >= 0")
    assert seen("TestNpu::test_npu") == (23, "torch.npu", "import torch_npu")
    assert seen("test_to_a_fixture") == (27, ".to(device)", "x = make().to(device)")
    # Its own lines show nothing: the module's other code does (the fixture's .cuda()).
    assert seen("test_uses_the_fixture") == (9, ".cuda(", "return Net().cuda()")
    assert seen("test_to_a_local[1]") == (9, ".cuda(", "return Net().cuda()")


def test_a_module_with_no_device_api_gives_nothing(tmp_path: Path) -> None:
    path = tmp_path / "test_cpu.py"
    path.write_text("def test_a():\n    assert 'cpu'\n")
    assert scan("test_cpu.py::test_a", path) is None
    assert scan("gone.py::test_a", tmp_path / "gone.py") is None
