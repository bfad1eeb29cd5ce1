"""``rig list``: the machine's NVIDIA GPUs and which path can open each.

Reads /sys/bus/pci through rig_pci alone: it imports neither rig_nv nor a backend (nor cffi),
so that listing stays as quick as ``rig --help``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence

from rig_cli.chips import chip, is_gpu
from rig_cli.show import MISSING, text
from rig_edge import RigError
from rig_pci import FunctionInfo, Machine

# The kernel drivers that leave a GPU to the NV-PCI path: none, or VFIO's.
DETACHED = (None, "vfio-pci")

# Every column `rig list` knows, in the order a full listing prints them. memory_bytes and
# uuid are read from the RM, only when asked for (--memory, or --query naming one): the RM is
# not sysfs.
RM_COLUMNS = ("memory_bytes", "uuid")
COLUMNS = (
    "index", "bus", "device_id", "name", "chip", "arch", "driver", "runtime_status", "paths",
    "driver_release", "bar1_bytes", *RM_COLUMNS,
)
# What --format csv prints when --query names no columns (the rest are in --json and --query).
CSV_DEFAULT = COLUMNS[:9]


# The driver releases rig_nv has struct layouts for (rig_nv.layouts.SUPPORTED; a test keeps the
# two equal: `rig list` must not import rig_nv, which brings cffi).
SUPPORTED_RELEASES = ("570", "580")


def driver_release(machine: Machine) -> str | None:
    """The loaded NVIDIA kernel driver's release (/sys/module/nvidia/version), or None."""
    try:
        return machine.sysfs.path("/sys/module/nvidia/version").read_text().strip() or None
    except (OSError, RigError):
        return None


def paths(function: FunctionInfo, index: int, release: str | None = None) -> list[str]:
    """The openers' names that can open this GPU now: "NV" where NVIDIA's kernel driver holds
    it in a release rig speaks (unknown counts as speakable), "NV-PCI" where it is detached."""
    names = []
    suffix = "" if index == 0 else f":{index}"
    if function.driver == "nvidia" and (
            release is None or release.split(".")[0] in SUPPORTED_RELEASES):
        names.append("NV" + suffix)
    if function.driver in DETACHED:
        names.append("NV-PCI" + suffix)
    return names


def bar1(function: FunctionInfo) -> int | None:
    """The size of NVIDIA's BAR1 (the aperture through which the host sees GPU memory).

    It is the first memory BAR after BAR0. Linux's resource lines count 32-bit registers, so
    behind a 64-bit BAR0 (as on the H200) BAR1 is resource 2; the upper half of BAR0 reads as
    zeros and the listing leaves it out.
    """
    return next((b.size for b in function.bars if b.index >= 1 and b.is_memory), None)


def from_rm(i: int) -> tuple[int | None, str | None]:
    """GPU ``i``'s memory in bytes and UUID as the RM of the kernel driver reports them (NV2080
    FB_INFO RAM_SIZE and GET_GID_INFO, through rig_nv_nvidia.usage and uuid: the process's
    client and the GPU's RM device, no channel). Loads rig_nv_nvidia, cffi with it: only
    ``--memory`` pays for that."""
    import rig_nv_nvidia

    return rig_nv_nvidia.usage(i).memory_total, rig_nv_nvidia.uuid(i)


def with_rm(found: list[dict[str, object]],
            read: Callable[[int], tuple[int | None, str | None]] | None,
            warn: Callable[[str], None]) -> None:
    """Fill each row's memory_bytes and uuid: from ``read`` (None: not this machine, nothing
    to ask) for a GPU that rig's kernel-driver path can open and whose function is active
    (asking could wake a suspended GPU); None elsewhere. A refusal is None and one warning."""
    for r in found:
        r["memory_bytes"] = r["uuid"] = None
        paths = r["paths"]
        assert isinstance(paths, list)
        nv = any(p == "NV" or p.startswith("NV:") for p in paths)
        if read is None or not nv or r["runtime_status"] != "active":
            continue
        index = r["index"]
        assert isinstance(index, int)
        try:
            r["memory_bytes"], r["uuid"] = read(index)
        except RigError as e:
            warn(f"GPU {index}'s memory and UUID: {e}")


def rows(machine: Machine) -> list[dict[str, object]]:
    """One row per NVIDIA GPU, in bus order (GPU i of both paths is the ith)."""
    gpus = [f for f in machine.functions() if is_gpu(f.vendor, f.class_code)]
    release = driver_release(machine) if any(f.driver == "nvidia" for f in gpus) else None
    found: list[dict[str, object]] = []
    for i, f in enumerate(gpus):
        known = chip(f.device)
        found.append({
            "index": i,
            "bus": f.address,
            "device_id": f"0x{f.device:04x}",
            "name": known.name,
            "chip": known.chip,
            "arch": known.arch,
            "driver": f.driver,
            "runtime_status": f.runtime_status,
            "paths": paths(f, i, release),
            "driver_release": release if f.driver == "nvidia" else None,
            "bar1_bytes": bar1(f),
            "memory_bytes": None,  # with_rm fills these two, run_list drops them unless asked
            "uuid": None,
        })
    return found


def parse_format(text: str) -> tuple[str, bool]:
    """``csv``, ``csv,noheader`` (nvidia-smi's words; ``nounits`` is taken and changes
    nothing, rig's values carry no units) → (format, header). Raises :class:`ValueError`."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in words if w not in ("csv", "noheader", "nounits")]
    if unknown or "csv" not in words:
        raise ValueError(f"format {text!r} is not csv, csv,noheader or csv,noheader,nounits")
    return "csv", "noheader" not in words


def parse_query(text: str) -> tuple[str, ...]:
    """Columns named ``a,b,c`` (any of :data:`COLUMNS`); raises :class:`ValueError`."""
    names = tuple(w.strip() for w in text.split(",") if w.strip())
    unknown = [n for n in names if n not in COLUMNS]
    if unknown or not names:
        raise ValueError(f"unknown column {', '.join(unknown) or '(none)'}; "
                         f"columns are {', '.join(COLUMNS)}")
    return names


def _cell(value: object) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value) if value else MISSING
    return text(value)


def csv_lines(found: list[dict[str, object]], columns: Sequence[str], header: bool) -> list[str]:
    """nvidia-smi's CSV: ``", "`` between values, a header line unless ``noheader``, lists
    (the paths) joined by spaces, ``[N/A]`` where a value is not there."""
    lines = [", ".join(columns)] if header else []
    lines += [", ".join(_cell(r[c]) for c in columns) for r in found]
    return lines


def run_list(
    *,
    as_json: bool = False,
    machine: Machine | None = None,
    fmt: tuple[str, bool] | None = None,
    columns: Sequence[str] | None = None,
    memory: bool = False,
) -> int:
    """Print the listing; with ``memory`` (or an RM column asked for) each GPU's memory and
    UUID from the RM as well, where the GPU is this machine's (``machine`` None)."""
    found = rows(machine or Machine.this())
    memory = memory or any(c in RM_COLUMNS for c in columns or ())
    if memory:
        with_rm(found, from_rm if machine is None else None,
                lambda line: print(f"rig: {line}", file=sys.stderr))
    else:
        for r in found:
            for c in RM_COLUMNS:
                del r[c]
    if as_json:
        shown = [{c: r[c] for c in columns} for r in found] if columns else found
        print(json.dumps(shown, indent=2))
        return 0
    if fmt is not None:
        for line in csv_lines(found, columns or CSV_DEFAULT, header=fmt[1]):
            print(line)
        return 0
    if not found:
        print("No NVIDIA GPU on this machine (none listed under /sys/bus/pci).")
        return 0
    head = ("GPU", "bus", "device", "product", "arch", "driver", "power")
    table: list[tuple[str, ...]] = [(*head, "memory", "uuid", "paths") if memory
                                    else (*head, "paths")]
    for r in found:
        product = MISSING if r["name"] is None else f"{r['name']} ({r['chip']})"
        cells = [text(r[c]) for c in ("index", "bus", "device_id")]
        cells += [product, *(text(r[c]) for c in ("arch", "driver", "runtime_status"))]
        if memory:
            size = r["memory_bytes"]
            cells.append(f"{size / (1 << 30):.1f} GiB" if isinstance(size, int) else MISSING)
            cells.append(text(r["uuid"]))
        table.append((*cells, _cell(r["paths"])))
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]) - 1)]
    for row in table:
        print(" ".join(v.ljust(w) for v, w in zip(row, widths, strict=False)) + " " + row[-1])
    return 0
