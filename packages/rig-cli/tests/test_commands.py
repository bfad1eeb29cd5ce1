"""The commands' own logic, in process, against stand-ins for what needs a GPU or a PCI path
that is not built yet: confirmation, usage's two displays, check's comparisons and codes."""

from __future__ import annotations

import io
import itertools
import json
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rig_cli import changes, check
from rig_cli.main import main
from rig_edge import Facts, Memory, Misuse, Region
from rig_pci import FunctionInfo

H200 = FunctionInfo(address="0000:00:06.0", vendor=0x10DE, device=0x2335, class_code=0x030200,
                    bars=(), driver="nvidia", iommu_group=None, runtime_status="active")


# ---- detach / attach / reset / firmware -------------------------------------------------


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Stand-ins for the PCI path's functions, recording their calls."""
    seen: list[tuple[str, Any]] = []

    def by_index(op: str) -> Any:
        def fn(i: int) -> Any:
            seen.append((op, i))
            return None
        return fn

    def fetch(directory: str | None = None, base_url: str | None = None) -> str:
        seen.append(("firmware", (directory, base_url)))
        return "kept 3, fetched 4"

    def find(op: str) -> Any:
        if op == "firmware":
            return "fake.fetch", fetch, "dir"
        return f"fake.{op}", by_index(op), "index"

    monkeypatch.setattr(changes, "find", find)
    monkeypatch.setattr(changes, "gpu", lambda i, machine=None: H200 if i == 0 else (
        _ for _ in ()).throw(changes.NoSuchGpu(f"this machine has no GPU {i} (it has 1)")))
    return seen


def test_yes_skips_the_question(calls: list[tuple[str, Any]],
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detach", "0", "--yes"]) == 0
    assert calls == [("detach", 0)]
    assert "NV-PCI can open it" in capsys.readouterr().out


def test_no_terminal_and_no_yes_refuses_without_changing(
        calls: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # not a terminal
    assert main(["reset", "0"]) == 2
    assert calls == []
    assert "--yes" in capsys.readouterr().err


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "code", "called"), [("y\n", 0, True), ("yes\n", 0, True),
                                                         ("n\n", 1, False), ("\n", 1, False)])
def test_the_question_on_a_terminal(calls: list[tuple[str, Any]],
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str],
                                    answer: str, code: int, called: bool) -> None:
    monkeypatch.setattr(sys, "stdin", Tty(answer))
    assert main(["attach", "0"]) == code
    assert calls == ([("attach", 0)] if called else [])
    out = capsys.readouterr()
    assert "Give GPU 0 (0000:00:06.0, H200) back to its kernel driver?" in out.out
    if not called:
        assert out.err == "rig: not confirmed, so nothing was changed.\n"


def test_no_such_gpu_is_asked_nothing(calls: list[tuple[str, Any]]) -> None:
    assert main(["detach", "3", "--yes"]) == 3
    assert calls == []


def test_detach_part_way_is_a_failure(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    @dataclass
    class PartWay:
        why: str

    monkeypatch.setattr(changes, "find",
                        lambda op: ("fake", lambda i: PartWay("unbind timed out"), "index"))
    monkeypatch.setattr(changes, "gpu", lambda i, machine=None: H200)
    assert main(["detach", "0", "--yes"]) == 1
    assert capsys.readouterr().err == (
        "rig: GPU 0 (0000:00:06.0): detach went only part way: unbind timed out.\n")


def test_firmware_passes_dir_and_mirror(calls: list[tuple[str, Any]],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["firmware", "nv", "/tmp/fw", "--base-url", "http://127.0.0.1:1/"]) == 0
    assert main(["firmware", "nv"]) == 0
    assert calls == [("firmware", ("/tmp/fw", "http://127.0.0.1:1/")),
                     ("firmware", (None, None))]
    assert "kept 3, fetched 4" in capsys.readouterr().out


def test_a_network_failure_is_exit_1_with_its_cause(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20 item 8: ``rig firmware nv`` that cannot reach the server broke (exit 1, not
    4, refused), and its sentence says why."""
    with socket.socket() as s:  # a port nobody listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["firmware", "nv", str(tmp_path / "fw"),
                 "--base-url", f"http://127.0.0.1:{port}/"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rig: firmware nvidia/") and "Connection refused" in err
    assert not [p for p in (tmp_path / "fw").rglob("*") if p.is_file()]


def test_find_tells_a_missing_module_from_a_broken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(changes.CANDIDATES, "detach", (("rig_no_such_module", "detach", "index"),))
    assert changes.find("detach") is None
    monkeypatch.setitem(changes.CANDIDATES, "detach", (("rig_cli.main", "exit_code", "index"),))
    found = changes.find("detach")
    assert found is not None and found[0] == "rig_cli.main.exit_code"


def test_negative_index_is_misuse() -> None:
    with pytest.raises(Misuse):
        changes.gpu(-1)


# ---- usage ------------------------------------------------------------------------------


@pytest.fixture
def fake_usage(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    import rig_nv_nvidia

    windows: list[float] = []
    free = itertools.count(100 << 30, -(1 << 30))

    def usage(i: int, window: float = 1.0) -> rig_nv_nvidia.Usage:
        windows.append(window)
        return rig_nv_nvidia.Usage(141 << 30, next(free), 12.5 if len(windows) > 1 else None)

    monkeypatch.setattr(rig_nv_nvidia, "usage", usage)
    monkeypatch.setattr(rig_nv_nvidia, "buses", lambda: ["0000:00:06.0"])
    yield windows


def stop_after(monkeypatch: pytest.MonkeyPatch, samples: int) -> None:
    import rig_cli.info

    slept = itertools.count(1)

    def sleep(s: float) -> None:
        if next(slept) >= samples:
            raise KeyboardInterrupt

    monkeypatch.setattr(rig_cli.info.time, "sleep", sleep)


def test_usage_once(fake_usage: list[float]) -> None:
    from rig_cli.info import run_usage

    out = io.StringIO()
    assert run_usage(0, window=2.0, watch=None, as_json=False, out=out) == 0
    assert out.getvalue() == ("GPU 0 0000:00:06.0: memory 41 GiB used of 141 GiB (100 GiB free), "
                              "busy no samples over 2 s\n")
    assert fake_usage == [2.0]


def test_usage_watch_prints_lines_when_not_a_terminal(fake_usage: list[float],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from rig_cli.info import run_usage

    stop_after(monkeypatch, 3)
    out = io.StringIO()
    assert run_usage(0, window=1.0, watch=0.5, as_json=False, out=out) == 0  # Ctrl-C: 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\x1b" not in out.getvalue()
    assert lines[1].endswith("memory 42 GiB used of 141 GiB (99 GiB free), busy 12.5 % over 1 s")


def test_usage_watch_redraws_in_place_on_a_terminal(fake_usage: list[float],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from rig_cli.info import run_usage

    stop_after(monkeypatch, 3)
    out = Tty()
    assert run_usage(0, window=1.0, watch=0.5, as_json=False, out=out) == 0
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 3 and text.count("\n") == 1 and text.endswith("\n")


def test_usage_watch_json_lines(fake_usage: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    from rig_cli.info import run_usage

    stop_after(monkeypatch, 2)
    out = io.StringIO()
    assert run_usage(0, window=1.0, watch=1.0, as_json=True, out=out) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["memory_free"] for r in records] == [100 << 30, 99 << 30]
    assert records[0]["busy"] is None and records[1]["busy"] == 12.5


# ---- check ------------------------------------------------------------------------------


@dataclass
class Done:
    def wait(self, timeout_s: float | None = None) -> None:
        return None


@dataclass
class FakeDevice:
    """A device in host memory whose vadd adds (or, when ``wrong``, gets one element wrong)."""

    arch: str = "sm_90"
    wrong: bool = False
    corrupt_copies: bool = False
    memory: dict[int, bytearray] = field(default_factory=dict)
    stopped: bool = False

    @property
    def facts(self) -> Facts:
        return Facts(name="NV", arch=self.arch, budget=1 << 30, queues=("compute", "copy"),
                     hang_ms=30000, maps_host=True, bus="0000:00:06.0", driver="580.159.04")

    def alloc(self, n: int, kind: Memory = Memory.DEVICE) -> Region:
        at = 0x1000_0000 * (len(self.memory) + 1)
        self.memory[at] = bytearray(n)
        return Region(at, None, n, kind)

    def free(self, region: Region) -> None:
        del self.memory[region.gpu]

    def upload(self, dst: Region, data: bytes, offset: int = 0) -> Done:
        self.memory[dst.gpu][offset : offset + len(data)] = data
        return Done()

    def download(self, src: Region, n: int | None = None, offset: int = 0) -> memoryview:
        n = src.length if n is None else n
        return memoryview(bytes(self.memory[src.gpu][offset : offset + n]))

    def copy(self, dst: Region, src: Region, n: int) -> Done:
        self.memory[dst.gpu][:n] = self.memory[src.gpu][:n]
        if self.corrupt_copies and dst.kind is Memory.PINNED:
            self.memory[dst.gpu][12345] ^= 0xFF
        return Done()

    def load(self, cubin: bytes) -> dict[str, str]:
        from rig_nv.cubin import parse

        assert parse(cubin).arch == self.arch
        return {"vadd": "vadd"}

    def launch(self, fn: str, grid: Any, block: Any, args: Any) -> Done:
        a, b, c, n = args
        sums = bytearray(check.vadd_on_host(bytes(self.memory[a.gpu]),
                                            bytes(self.memory[b.gpu])))
        if self.wrong:
            sums[4 * (n - 1)] ^= 1
        self.memory[c.gpu][:] = sums
        return Done()

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    import rig_nv_nvidia

    d = FakeDevice()
    monkeypatch.setattr(rig_nv_nvidia, "gpu", lambda i: type("O", (), {"open": lambda s: d})())
    monkeypatch.setattr(check, "KERNEL_ELEMENTS", 1 << 12)
    monkeypatch.setattr(check, "TIMED_LAUNCHES", 3)
    return d


def test_check_passes_and_stops(device: FakeDevice, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--size", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rig check: GPU 0 (NV) at 0000:00:06.0: sm_90, driver 580.159.04;")
    for step in ("upload   host → Device", "download Device → host",
                 "copy     Pinned → Device (engine)", "copy     Device → Pinned (engine)",
                 "load     vadd.sm_90.cubin", "launch   vadd, 4096 u32, first",
                 "launch+wait, median of 3", "stop"):
        assert step in out, step
    assert "GB/s" in out and "FAILED" not in out and "GPU 0 passed every check." in out
    assert device.stopped


def test_check_json(device: FakeDevice, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--size", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["arch"] == "sm_90"
    assert [s["ok"] for s in report["steps"]] == [True] * len(report["steps"])
    assert report["steps"][1]["nbytes"] == 1 << 20


def test_check_finds_a_wrong_sum(device: FakeDevice, capsys: pytest.CaptureFixture[str]) -> None:
    device.wrong = True
    assert main(["check", "--size", "1"]) == 1
    out = capsys.readouterr()
    assert f"FAILED  first difference at byte {4 * ((1 << 12) - 1)}" in out.out
    assert out.err == ("rig: GPU 0 failed the check (launch vadd, 4096 u32, first; "
                       "launch+wait, median of 3): its results differ from the host's.\n")
    assert device.stopped


def test_check_finds_a_corrupt_copy(device: FakeDevice,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    device.corrupt_copies = True
    assert main(["check", "--size", "1"]) == 1
    out = capsys.readouterr()
    assert "copy     Device → Pinned (engine)" in out.out
    assert "FAILED  first difference at byte 12345" in out.out
    assert "(copy Device → Pinned (engine))" in out.err


def test_check_without_a_kernel_for_the_arch_is_refused(
        device: FakeDevice, capsys: pytest.CaptureFixture[str]) -> None:
    device.arch = "sm_75"
    assert main(["check", "--size", "1"]) == 4
    err = capsys.readouterr().err
    assert err == ("rig: NV (0000:00:06.0): rig has no built-in kernel for sm_75 (it has sm_80, "
                   "sm_86, sm_89, sm_90, sm_100, sm_120), so the kernel was not checked.\n")


def test_check_without_numpy(device: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy now raises ImportError
    name, random = check.random_source()
    assert name == "os.urandom" and len(random(16)) == 16
    assert main(["check", "--size", "1"]) == 0
    a = bytes.fromhex("ffffffff01000000")
    b = bytes.fromhex("0200000002000000")
    assert check.vadd_on_host(a, b) == bytes.fromhex("0100000003000000")


def test_first_difference() -> None:
    want = bytes(range(256)) * 1024
    assert check.first_difference(want, want) is None
    got = bytearray(want)
    got[200_000] ^= 0x80
    assert check.first_difference(bytes(got), want) == 200_000
    assert check.first_difference(want[:10], want) == 10
