"""`rig list` in its formats (table, --json, nvidia-smi's CSV), on fixture sysfs trees, and the
device-id table it names chips from."""

import json
from pathlib import Path

import pytest

from rig_cli import chips
from rig_cli.listing import COLUMNS
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
        "2, 0000:00:08.0, 0x1eb8, [N/A], [N/A], [N/A], [N/A], [N/A], NV-PCI:2",
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
        "0000:00:08.0, [N/A], [N/A]",
    ]
    import json

    rows = json.loads(rig("list", "--json", "--query", "index,chip", "--machine",
                          str(machine)).stdout)
    assert rows == [{"index": 0, "chip": "GH100"}, {"index": 1, "chip": "GB202"},
                    {"index": 2, "chip": None}]


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
    assert lines[3].split()[3:7] == ["[N/A]"] * 4  # product, arch, driver, power not there
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
    assert chips.chip(0xFFFF) == chips.Chip(None, None, None)


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
    """memory_bytes and uuid come from the RM, only with --memory or a query naming one; a
    machine under --machine has no RM to ask, so they are [N/A] there."""
    plain = json.loads(rig("list", "--json", "--machine", str(machine)).stdout)
    assert all("memory_bytes" not in r and "uuid" not in r for r in plain)
    asked = json.loads(rig("list", "--json", "--memory", "--machine", str(machine)).stdout)
    assert [(r["memory_bytes"], r["uuid"]) for r in asked] == [(None, None)] * 3
    out = rig("list", "--format", "csv", "--query", "bus,memory_bytes", "--machine", str(machine))
    assert out.stdout.splitlines()[:2] == ["bus, memory_bytes", "0000:00:06.0, [N/A]"]
    table = rig("list", "--memory", "--machine", str(machine)).stdout.splitlines()
    assert table[0].split()[7:9] == ["memory", "uuid"]
    assert table[1].split()[8:10] == ["[N/A]", "[N/A]"]


def test_memory_and_uuid_ask_only_the_kernel_drivers_active_gpus(machine: Path) -> None:
    """Issue 22, trip 5: `rig list` gains a UUID column where the RM reports one."""
    from rig_cli.listing import rows, with_rm
    from rig_edge import RigError
    from rig_pci import Machine

    found = rows(Machine.at(str(machine)))
    asked: list[int] = []
    warnings: list[str] = []

    uuid = "GPU-8e3f4b1c-0d2a-4c5e-9f60-7a1b2c3d4e5f"

    def read(i: int) -> tuple[int, str]:
        asked.append(i)
        return 141 << 30, uuid

    with_rm(found, read, warnings.append)
    assert asked == [0]
    assert [(r["memory_bytes"], r["uuid"]) for r in found] == [(141 << 30, uuid),
                                                                (None, None), (None, None)]

    def refuses(i: int) -> tuple[int, str]:
        raise RigError("the RM refused")

    with_rm(found, refuses, warnings.append)
    assert (found[0]["memory_bytes"], found[0]["uuid"]) == (None, None)
    assert warnings == ["GPU 0's memory and UUID: the RM refused"]


def test_query_alone_prints_csv(machine: Path) -> None:
    """Issue 22, trip 5: --query was ignored without --format; alone it prints those columns as
    CSV (with --json, as JSON)."""
    out = rig("list", "--query", "bus,arch", "--machine", str(machine))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["bus, arch", "0000:00:06.0, sm_90",
                                       "0000:00:07.0, sm_120", "0000:00:08.0, [N/A]"]


def test_json_with_format_is_misuse(machine: Path) -> None:
    """Issue 22, trip 5: `--json --format csv` printed JSON silently; now it is refused."""
    out = rig("list", "--json", "--format", "csv", "--machine", str(machine))
    assert out.returncode == 2 and out.stdout == ""
    assert "--format: not allowed with argument --json" in out.stderr


def test_a_machine_root_that_does_not_exist_is_misuse(tmp_path: Path) -> None:
    """Issue 22, trip 5: `--machine /nonexistent` said "No NVIDIA GPU on this machine", exit 0."""
    out = rig("list", "--machine", str(tmp_path / "nonexistent"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (f"rig: --machine {tmp_path / 'nonexistent'}: no such "
                                  "directory (it names the root of a machine's sysfs tree, or "
                                  "is ssh://[user@]host[:port])")


def test_a_missing_value_is_one_word_everywhere(machine: Path) -> None:
    """Issue 22, trip 5: missing values were `-`, `unknown`, `[N/A]`, `null` or `none` by place:
    now [N/A] in every table and CSV, null in JSON."""
    table = rig("list", "--memory", "--machine", str(machine)).stdout
    csv = rig("list", "--format", "csv", "--query", ",".join(COLUMNS), "--machine",
              str(machine)).stdout
    for text in (table, csv):
        words = set(text.replace(",", " ").split())
        assert "[N/A]" in words and not words & {"-", "unknown", "none", "null", "None"}, text
    rows = json.loads(rig("list", "--json", "--memory", "--machine", str(machine)).stdout)
    values = {v for r in rows for v in r.values() if not isinstance(v, list)}
    assert None in values and not values & {"-", "unknown", "none", "[N/A]"}
