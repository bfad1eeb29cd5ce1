"""The real `rig` command, run as a subprocess on fixture sysfs trees."""

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rig_cli.testing import rig
from rig_pci.testing import add_function

COMMANDS = ("list", "info", "usage", "check", "detach", "attach", "reset", "firmware")


def test_help_and_version() -> None:
    """Issue 22, trip 5: `rig --help` listed the commands twice (argparse's list and an epilog
    that left one out): now once each, in argparse's list."""
    out = rig("--help")
    assert out.returncode == 0 and "exit codes" in out.stdout
    words = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("    ")
             and not line.startswith("     ")]
    assert words == list(COMMANDS)
    for command in COMMANDS:
        sub = rig(command, "--help")
        assert sub.returncode == 0 and f"usage: rig {command}" in sub.stdout, command
    for code, meaning in (("0", "ok"), ("1", "failure"), ("2", "misuse"), ("3", "no such GPU"),
                          ("4", "refused")):
        assert f"  {code}  {meaning}" in out.stdout
    out = rig("--version")
    assert out.returncode == 0 and out.stdout.strip() == "rig 0.1.0"


def test_no_command_is_misuse() -> None:
    assert rig().returncode == 2
    assert rig("frobnicate").returncode == 2


def test_list_says_plainly_when_there_is_none(tmp_path: Path) -> None:
    out = rig("list", "--machine", str(tmp_path))
    assert out.returncode == 0
    assert "No NVIDIA GPU" in out.stdout
    assert json.loads(rig("list", "--json", "--machine", str(tmp_path)).stdout) == []


def test_list_shows_each_gpu_and_the_paths_that_open_it(tmp_path: Path) -> None:
    add_function(
        tmp_path,
        "0000:00:06.0",
        vendor=0x10DE,
        device=0x2335,
        class_code=0x030200,
        driver="nvidia",
        bars={1: (1 << 40, 256 << 30, True)},
    )
    add_function(
        tmp_path,
        "0000:00:07.0",
        vendor=0x10DE,
        device=0x2684,
        class_code=0x030000,
        driver="vfio-pci",
        iommu_group=3,
    )
    add_function(tmp_path, "0000:00:07.1", vendor=0x10DE, device=0x22BA, class_code=0x040300)
    add_function(
        tmp_path,
        "0000:00:08.0",
        vendor=0x10DE,
        device=0x2204,
        class_code=0x030000,
        driver="nouveau",
    )
    out = rig("list", "--json", "--machine", str(tmp_path))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["bus"], r["paths"]) for r in rows] == [
        ("0000:00:06.0", ["NV"]),
        ("0000:00:07.0", ["NV-PCI:1"]),
        ("0000:00:08.0", []),
    ]
    assert rows[0]["device_id"] == "0x2335" and rows[0]["bar1_bytes"] == 256 << 30
    text = rig("list", "--machine", str(tmp_path)).stdout
    assert "0000:00:06.0" in text and "NV-PCI:1" in text
    assert text.splitlines()[3].split()[-1] == "[N/A]"  # no path opens it


def test_list_error_is_one_sentence_and_refused_code(tmp_path: Path) -> None:
    (tmp_path / "sys/bus/pci").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").write_text("")
    out = rig("list", "--machine", str(tmp_path))
    assert out.returncode == 4
    assert out.stderr.startswith("rig: ") and len(out.stderr.strip().splitlines()) == 1


def test_start_up_is_light() -> None:
    # `rig --help` must not import the GPU paths; the bound is generous for a loaded CI machine.
    code = (
        "import sys, rig_cli.main as m; m._parser(); "
        "print(sorted(k for k in sys.modules if k.startswith('rig_')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout.strip() == "['rig_cli', 'rig_cli.main']"
    t = time.perf_counter()
    assert rig("--help").returncode == 0
    assert time.perf_counter() - t < 2.0


def test_list_is_light_too(tmp_path: Path) -> None:
    # `rig list` reads sysfs through rig_pci alone: no GPU path, no cffi, no numpy.
    add_function(tmp_path, "0000:00:06.0", vendor=0x10DE, device=0x2335, class_code=0x030200,
                 driver="nvidia")
    code = (
        "import sys; from rig_cli.main import main; "
        f"assert main(['list', '--format', 'csv', '--machine', {str(tmp_path)!r}]) == 0; "
        "print(sorted({k.split('.')[0] for k in sys.modules}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    loaded = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert {m for m in loaded if m.startswith("rig_")} == {"rig_cli", "rig_edge", "rig_pci"}
    assert not {"cffi", "numpy", "rig_nv", "rig_nv_nvidia", "rig_nv_pci"} & set(loaded)
    t = time.perf_counter()
    assert rig("list", "--machine", str(tmp_path)).returncode == 0
    assert time.perf_counter() - t < 2.0


def test_bench_is_not_a_command_and_the_word_splits_nothing(tmp_path: Path) -> None:
    """Issue 22, trip 5: `rig bench` ran a checkout's harness, and any argument word `bench`
    split the command line (`rig list --machine bench --json` printed a table). The
    benchmark is bench/run.py of the repository; `rig check` times a GPU's copies and launches."""
    out = rig("bench")
    assert out.returncode == 2 and "invalid choice: 'bench'" in out.stderr
    machine = tmp_path / "bench"
    add_function(machine, "0000:00:06.0", vendor=0x10DE, device=0x2335, class_code=0x030200,
                 driver="nvidia")
    out = subprocess.run([sys.executable, "-m", "rig_cli", "list", "--machine", "bench",
                          "--json"], capture_output=True, text=True, cwd=tmp_path, check=False,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert [r["bus"] for r in json.loads(out.stdout)] == ["0000:00:06.0"]
