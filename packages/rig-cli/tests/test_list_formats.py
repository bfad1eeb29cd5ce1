"""`rig list` in its formats (table, --json, nvidia-smi's CSV), on fixture sysfs trees, and the
device-id table it names chips from."""

import json
from pathlib import Path

import pytest

from rig_cli import chips
from rig_cli.testing import rig
from rig_pci.testing import add_function


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    # An H200 as the GPU machine shows it: a 64-bit BAR0 (16 MiB), so BAR1 (256 GiB) is
    # resource 2 and BAR3 (32 MiB) resource 4.
    add_function(tmp_path, "0000:00:06.0", vendor=0x10DE, device=0x2335, class_code=0x030200,
                 driver="nvidia",
                 bars={0: (0xFD000000, 16 << 20, False), 2: (1 << 40, 256 << 30, True),
                       4: (1 << 41, 32 << 20, True)})
    add_function(tmp_path, "0000:00:07.0", vendor=0x10DE, device=0x2B85, class_code=0x030000,
                 driver="vfio-pci", iommu_group=3)
    add_function(tmp_path, "0000:00:07.1", vendor=0x10DE, device=0x22E8, class_code=0x040300)
    add_function(tmp_path, "0000:00:08.0", vendor=0x10DE, device=0x1EB8, class_code=0x030200,
                 runtime_status=None)
    add_function(tmp_path, "0000:00:09.0", vendor=0x8086, device=0x2335, class_code=0x030000)
    return tmp_path


def test_csv_in_the_manner_of_nvidia_smi(machine: Path) -> None:
    out = rig("list", "--format", "csv", "--machine", str(machine))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "index, bus, device_id, name, chip, arch, driver, runtime_status, paths",
        "0, 0000:00:06.0, 0x2335, H200, GH100, sm_90, nvidia, active, NV",
        "1, 0000:00:07.0, 0x2b85, GeForce RTX 5090, GB202, sm_120, vfio-pci, active, NV-PCI:1",
        "2, 0000:00:08.0, 0x1eb8, unknown, unknown, unknown, [N/A], [N/A], NV-PCI:2",
    ]
    noheader = rig("list", "--format=csv,noheader", "--machine", str(machine))
    assert noheader.returncode == 0
    assert noheader.stdout.splitlines() == out.stdout.splitlines()[1:]
    # nvidia-smi's other word, nounits, is taken (rig's values carry no units).
    assert rig("list", "--format", "csv,noheader,nounits", "--machine",
               str(machine)).stdout == noheader.stdout


def test_query_picks_columns(machine: Path) -> None:
    out = rig("list", "--format", "csv", "--query-gpu", "bus,arch,bar1_bytes", "--machine",
              str(machine))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "bus, arch, bar1_bytes",
        f"0000:00:06.0, sm_90, {256 << 30}",
        "0000:00:07.0, sm_120, [N/A]",
        "0000:00:08.0, unknown, [N/A]",
    ]
    import json

    rows = json.loads(rig("list", "--json", "--query", "index,chip", "--machine",
                          str(machine)).stdout)
    assert rows == [{"index": 0, "chip": "GH100"}, {"index": 1, "chip": "GB202"},
                    {"index": 2, "chip": "unknown"}]


def test_json_has_every_column(machine: Path) -> None:
    import json

    rows = json.loads(rig("list", "--json", "--machine", str(machine)).stdout)
    assert rows[0] == {
        "index": 0, "bus": "0000:00:06.0", "device_id": "0x2335", "name": "H200",
        "chip": "GH100", "arch": "sm_90", "driver": "nvidia", "runtime_status": "active",
        "paths": ["NV"], "driver_release": None, "bar1_bytes": 256 << 30,
    }


def test_table_names_chips(machine: Path) -> None:
    out = rig("list", "--machine", str(machine))
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["GPU", "bus", "device", "product", "arch", "driver", "power",
                                "paths"]
    assert "H200 (GH100)" in lines[1] and "sm_90" in lines[1]
    assert "GeForce RTX 5090 (GB202)" in lines[2] and "NV-PCI:1" in lines[2]
    assert "unknown" in lines[3]
    assert len(lines) == 4  # neither the audio function nor the Intel device


def test_empty_machine_csv_is_just_the_header(tmp_path: Path) -> None:
    out = rig("list", "--format", "csv", "--machine", str(tmp_path))
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        "index, bus, device_id, name, chip, arch, driver, runtime_status, paths"]
    assert rig("list", "--format", "csv,noheader", "--machine", str(tmp_path)).stdout == ""


@pytest.mark.parametrize("args", [
    ("--format", "xml"), ("--format", "noheader"), ("--format", "csv,bogus"),
    ("--format", "csv", "--query", "index,colour"), ("--query", ""),
])
def test_bad_format_or_query_is_misuse(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = rig("list", *args, "--machine", str(tmp_path))
    assert out.returncode == 2
    assert "rig list: error:" in out.stderr


def test_chip_table() -> None:
    expected = {
        0x2335: ("GH100", "sm_90"), 0x2330: ("GH100", "sm_90"), 0x2331: ("GH100", "sm_90"),
        0x20B0: ("GA100", "sm_80"), 0x20B2: ("GA100", "sm_80"), 0x20F1: ("GA100", "sm_80"),
        0x26B9: ("AD102", "sm_89"), 0x2684: ("AD102", "sm_89"), 0x2204: ("GA102", "sm_86"),
        0x2901: ("GB100", "sm_100"), 0x2B85: ("GB202", "sm_120"),
    }
    assert {k: (v.chip, v.arch) for k, v in chips.CHIPS.items()} == expected
    assert chips.chip(0xFFFF) == chips.Chip("unknown", "unknown", "unknown")


def test_is_gpu_agrees_with_rig_nv() -> None:
    # rig list keeps its own copy so as not to import rig_nv (and cffi): it must not drift.
    import rig_nv
    from rig_nv import pci

    assert chips.NVIDIA == pci.NVIDIA and chips.GPU_CLASSES == pci.GPU_CLASSES
    for vendor in (0x10DE, 0x8086, 0x1002):
        for class_code in (0x030000, 0x030200, 0x030100, 0x040300, 0x0C0330, 0x068000):
            function = type("F", (), {"vendor": vendor, "class_code": class_code})()
            assert chips.is_gpu(vendor, class_code) == rig_nv.is_gpu(function)


def test_an_unsupported_driver_release_offers_no_nv_opener(tmp_path: Path) -> None:
    """rig list: "which path can open it (kernel driver present and release supported)"."""
    add_function(tmp_path, "0000:00:06.0", vendor=0x10DE, device=0x2335, class_code=0x030200,
                 driver="nvidia")
    version = tmp_path / "sys/module/nvidia/version"
    version.parent.mkdir(parents=True)
    for release, opens in (("580.159.04", ["NV"]), ("570.144", ["NV"]), ("595.45.04", [])):
        version.write_text(release + "\n")
        out = rig("list", "--json", "--machine", str(tmp_path))
        (row,) = json.loads(out.stdout)
        assert (row["paths"], row["driver_release"]) == (opens, release)


def test_the_cli_knows_the_releases_rig_nv_speaks() -> None:
    from rig_cli.listing import SUPPORTED_RELEASES
    from rig_nv.layouts import SUPPORTED

    assert SUPPORTED_RELEASES == SUPPORTED


def test_memory_is_asked_for_only(machine: Path) -> None:
    """memory_bytes comes from the RM, only with --memory or a query naming it; a machine
    under --machine has no RM to ask, so it is [N/A] there."""
    plain = json.loads(rig("list", "--json", "--machine", str(machine)).stdout)
    assert all("memory_bytes" not in r for r in plain)
    asked = json.loads(rig("list", "--json", "--memory", "--machine", str(machine)).stdout)
    assert [r["memory_bytes"] for r in asked] == [None, None, None]
    out = rig("list", "--format", "csv", "--query", "bus,memory_bytes", "--machine", str(machine))
    assert out.stdout.splitlines()[:2] == ["bus, memory_bytes", "0000:00:06.0, [N/A]"]
    table = rig("list", "--memory", "--machine", str(machine)).stdout.splitlines()
    assert table[0].split()[7] == "memory" and table[1].split()[8] == "-"


def test_memory_asks_only_the_kernel_drivers_active_gpus(machine: Path) -> None:
    from rig_cli.listing import rows, with_memory
    from rig_edge import RigError
    from rig_pci import Machine

    found = rows(Machine.at(str(machine)))
    asked: list[int] = []
    warnings: list[str] = []

    def memory(i: int) -> int:
        asked.append(i)
        return 141 << 30

    with_memory(found, memory, warnings.append)
    assert asked == [0] and [r["memory_bytes"] for r in found] == [141 << 30, None, None]

    def refuses(i: int) -> int:
        raise RigError("the RM refused")

    with_memory(found, refuses, warnings.append)
    assert found[0]["memory_bytes"] is None
    assert warnings == ["GPU 0's memory: the RM refused"]
