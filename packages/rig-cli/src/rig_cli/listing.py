"""``rig list``: the machine's NVIDIA GPUs and which path can open each."""

from __future__ import annotations

import json

from rig_nv import is_gpu
from rig_pci import FunctionInfo, Machine

# The kernel drivers that leave a GPU to the NV-PCI path: none, or VFIO's.
DETACHED = (None, "vfio-pci")


def paths(function: FunctionInfo, index: int) -> list[str]:
    """The openers' names that can open this GPU now."""
    names = []
    suffix = "" if index == 0 else f":{index}"
    if function.driver == "nvidia":
        names.append("NV" + suffix)
    if function.driver in DETACHED:
        names.append("NV-PCI" + suffix)
    return names


def rows(machine: Machine) -> list[dict[str, object]]:
    """One row per NVIDIA GPU, in bus order (GPU i of both paths is the ith)."""
    gpus = [f for f in machine.functions() if is_gpu(f)]
    return [
        {
            "index": i,
            "bus": f.address,
            "device_id": f"0x{f.device:04x}",
            "driver": f.driver,
            "runtime_status": f.runtime_status,
            "paths": paths(f, i),
            "bar1_bytes": next((b.size for b in f.bars if b.index == 1), None),
        }
        for i, f in enumerate(gpus)
    ]


def run_list(*, as_json: bool, machine: Machine | None = None) -> int:
    found = rows(machine or Machine.this())
    if as_json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print("No NVIDIA GPU on this machine (none listed under /sys/bus/pci).")
        return 0
    print(f"{'GPU':<4} {'bus':<13} {'device':<7} {'driver':<10} {'power':<10} paths")
    for r in found:
        opens = ", ".join(r["paths"]) if isinstance(r["paths"], list) and r["paths"] else "none"
        print(
            f"{r['index']!s:<4} {r['bus']!s:<13} {r['device_id']!s:<7} "
            f"{r['driver'] or '-'!s:<10} {r['runtime_status'] or '-'!s:<10} {opens}"
        )
    return 0
