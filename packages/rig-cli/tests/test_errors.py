"""Exit codes and error sentences: the real CLI on this machine for the paths that need no GPU,
and the mapping from each kind of error to its code."""

import subprocess
from pathlib import Path

import pytest

from rig_cli.changes import NoSuchGpu, NotBuilt, find
from rig_cli.main import exit_code, sentence
from rig_cli.testing import rig
from rig_edge import Fault, Lost, Misuse, OpenRefused, OutOfMemory, RigError


def gpus() -> int:
    from rig_cli.chips import is_gpu
    from rig_pci import Machine

    return sum(is_gpu(f.vendor, f.class_code) for f in Machine.this().functions())


def one_sentence(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rig: "), out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


def test_info_of_a_gpu_the_machine_lacks_is_3() -> None:
    """Issue 22, trip 5: "NV: the machine has no GPU 0" was jargon and did not point at
    `rig list`."""
    missing = max(5, gpus())  # `rig info 5` on a machine with no GPU (CI's)
    out = rig("info", str(missing))
    assert out.returncode == 3, out.stderr
    assert one_sentence(out) == (f"rig: this machine has no GPU {missing}; `rig list` shows "
                                 "its GPUs.")
    assert out.stdout == ""


def test_check_with_no_such_gpu_is_3() -> None:
    args = ("check",) if gpus() == 0 else ("check", str(gpus()))
    out = rig(*args)
    assert out.returncode == 3, out.stderr
    assert "has no GPU" in one_sentence(out)


def test_usage_of_no_such_gpu_is_3() -> None:
    out = rig("usage", str(gpus()))
    assert out.returncode == 3, out.stderr
    one_sentence(out)


@pytest.mark.parametrize("args", [
    ("usage", "-1"), ("info", "-1"), ("check", "-1"), ("usage", "--window", "0"),
    ("usage", "--watch", "-2"), ("check", "--size", "0"),
])
def test_bad_values_are_misuse(args: tuple[str, ...]) -> None:
    """Issue 22, trip 5: a value out of range names its flag (`--window 0`)."""
    out = rig(*args)
    assert out.returncode == 2, out.stderr
    line = one_sentence(out)
    flag = next((a for a in args if a.startswith("--")), None)
    assert (flag if flag else "index i") in line, line


@pytest.mark.parametrize("args", [
    ("info", "zero"), ("usage", "--window", "soon"), ("detach",), ("firmware", "amd"),
    ("check", "--bogus"), ("frobnicate",),
])
def test_bad_arguments_are_misuse(args: tuple[str, ...]) -> None:
    out = rig(*args)
    assert out.returncode == 2
    assert "error:" in out.stderr


def test_debug_shows_the_traceback_before_or_after_the_command() -> None:
    missing = str(max(5, gpus()))
    for args in (("--debug", "info", missing), ("info", missing, "--debug")):
        out = rig(*args)
        assert out.returncode == 1  # Python's own code for an uncaught exception
        assert "Traceback" in out.stderr and "OpenRefused" in out.stderr


@pytest.mark.parametrize("command", ["detach", "attach", "reset"])
def test_changes_before_the_pci_path_exists(command: str) -> None:
    out = rig(command, str(gpus()), "--yes")
    line = one_sentence(out)
    if find(command) is None:
        assert out.returncode == 4
        assert line == (f"rig: rig {command} is not available in this release "
                        "(the PCI path is not built yet)")
    else:  # built since: GPU `count` does not exist, and nothing is asked or changed
        assert out.returncode == 3 and "has no GPU" in line


@pytest.mark.parametrize(("error", "code"), [
    (Misuse("GPU index -1 is negative"), 2),
    (ValueError("bad"), 2),
    (OpenRefused("NV:5: the machine has no GPU 5 (it has 0)"), 3),
    (NoSuchGpu("this machine has no GPU 2 (it has 1)"), 3),
    (OpenRefused("NV (0000:00:06.0): NVIDIA's kernel driver does not hold this GPU"), 4),
    (RigError("NV: driver release 999.1 is not supported"), 4),
    (NotBuilt("rig detach is not available in this release"), 4),
    (OutOfMemory("NV: out of device memory"), 4),
    (Lost("the GPU stopped answering"), 1),
    (Fault("ROBUST_CHANNEL_GR_EXCEPTION"), 1),
    (RuntimeError("boom"), 1),
    (OSError(5, "Input/output error"), 1),
])
def test_exit_code_of_each_error(error: BaseException, code: int) -> None:
    assert exit_code(error) == code


def test_sentence_is_one_line() -> None:
    assert sentence(RigError("NV: the RM\nrefused")) == "rig: NV: the RM refused"
    assert sentence(RuntimeError("boom")) == (
        "rig: RuntimeError: boom (--debug shows the traceback)")


def test_firmware_that_cannot_be_fetched_is_a_failure_not_a_refusal(tmp_path: Path) -> None:
    """Issue 22, trip 5: `rig firmware` exited 4 ("refused") on a network failure: it is 1."""
    out = rig("firmware", "nv", str(tmp_path), "--base-url", "http://127.0.0.1:9/")
    assert out.returncode == 1, out.stderr
    assert "fetching http://127.0.0.1:9/" in one_sentence(out)
