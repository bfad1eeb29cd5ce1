"""Fixture sysfs trees, so that code reading /sys/bus/pci can be tested without hardware.

``add_function(root, ...)`` writes one function the way Linux shows it; ``Machine.at(root)``
then lists it.
"""

from __future__ import annotations

import os
from pathlib import Path

from rig_pci.machine import DEVICES, IORESOURCE_MEM, IORESOURCE_MEM_64, IORESOURCE_PREFETCH


def add_function(
    root: Path,
    address: str,
    *,
    vendor: int,
    device: int,
    class_code: int,
    bars: dict[int, tuple[int, int, bool]] | None = None,
    driver: str | None = None,
    iommu_group: int | None = None,
    runtime_status: str | None = "active",
) -> Path:
    """Write a function's sysfs directory under ``root``; ``bars`` maps index →
    (address, size, prefetchable). Returns the directory."""
    real = root / "sys/devices/pci0000:00" / address
    real.mkdir(parents=True, exist_ok=True)
    (real / "vendor").write_text(f"0x{vendor:04x}\n")
    (real / "device").write_text(f"0x{device:04x}\n")
    (real / "class").write_text(f"0x{class_code:06x}\n")
    lines = []
    for i in range(13):
        if bars and i in bars:
            addr, size, pref = bars[i]
            flags = IORESOURCE_MEM | IORESOURCE_MEM_64 | (IORESOURCE_PREFETCH if pref else 0)
            lines.append(f"0x{addr:016x} 0x{addr + size - 1:016x} 0x{flags:016x}")
        else:
            lines.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
    (real / "resource").write_text("\n".join(lines) + "\n")
    if runtime_status is not None:
        (real / "power").mkdir(exist_ok=True)
        (real / "power" / "runtime_status").write_text(runtime_status + "\n")
    if driver is not None:
        drv = root / "sys/bus/pci/drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drv, real), real / "driver")
    if iommu_group is not None:
        grp = root / "sys/kernel/iommu_groups" / str(iommu_group)
        grp.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(grp, real), real / "iommu_group")
    devices = root / DEVICES
    devices.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, devices), devices / address)
    return real
