"""The commands that open a GPU, run for real: marked ``gpu``, skipped where /dev/nvidiactl is
absent. They only read and compute: nothing here detaches, resets or re-binds the GPU."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"),
                       reason="no NVIDIA kernel driver here (/dev/nvidiactl is absent)"),
]


def rig(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rig_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_info() -> None:
    out = rig("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    listed = json.loads(rig("list", "--json").stdout)[0]
    assert info["bus"] == listed["bus"] and info["device_id"] == listed["device_id"]
    if listed["arch"] is not None:
        assert info["arch"] == listed["arch"]
    assert info["sm_count"] > 0 and info["budget_bytes"] > 1 << 30
    assert info["bar1_bytes"] == listed["bar1_bytes"] and info["bar1_bytes"] > 0
    assert all(v.startswith("0x") for v in info["classes"].values())
    assert info["driver"].count(".") >= 1 and info["queues"] == ["compute", "copy"]
    text = rig("info")
    assert text.returncode == 0 and "classes" in text.stdout and "BAR1" in text.stdout
    # info stopped its device: the GPU opens again at once.
    assert rig("info", "--json").returncode == 0


def test_usage_once_and_watching() -> None:
    out = rig("usage", "--json")
    assert out.returncode == 0, out.stderr
    u = json.loads(out.stdout)
    assert 0 < u["memory_free"] <= u["memory_total"]
    assert u["busy"] is None or 0.0 <= u["busy"] <= 100.0
    # Not a terminal: a line per sample; Ctrl-C (SIGINT) ends it with exit code 0.
    p = subprocess.Popen(
        [sys.executable, "-m", "rig_cli", "usage", "--watch", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    time.sleep(3.0)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 0, stderr
    lines = stdout.splitlines()
    assert len(lines) >= 3 and all("memory" in line and "busy" in line for line in lines)
    assert "\x1b" not in stdout


def test_check() -> None:
    out = rig("check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "GPU 0 passed every check." in out.stdout
    print(out.stdout)
    report = json.loads(rig("check", "--json", "--size", "256").stdout)
    assert report["ok"] is True and report["refused"] is None
    steps = {s["step"].split()[0]: s for s in report["steps"]}
    assert steps["upload"]["nbytes"] == 256 << 20
    print(json.dumps(report, indent=1))


def test_list_memory_reads_the_rm() -> None:
    """`rig list --memory`: each kernel-driver GPU's memory, as `rig usage` reports its total."""
    out = rig("list", "--memory", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    usage = json.loads(rig("usage", "--json").stdout)
    assert rows[0]["memory_bytes"] == usage["memory_total"] > 16 << 30
    table = rig("list", "--memory")
    assert table.returncode == 0 and "GiB" in table.stdout.splitlines()[1]


def test_list_uuid_is_the_kernel_drivers() -> None:
    """Issue 22, trip 5: `rig list --memory` has each GPU's UUID from the RM, the one the
    kernel driver prints in /proc/driver/nvidia/gpus/BUS/information."""
    from pathlib import Path

    rows = json.loads(rig("list", "--memory", "--json").stdout)
    for r in rows:
        if r["uuid"] is None:
            continue
        info = Path(f"/proc/driver/nvidia/gpus/{r['bus']}/information")
        if info.exists():
            said = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                    if line.startswith("GPU UUID")]
            assert said == [r["uuid"]]
        assert r["uuid"].startswith("GPU-") and len(r["uuid"]) == 40
