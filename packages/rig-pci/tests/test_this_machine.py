"""The read-only check of issue 3 on the GPU machine: Machine.this() lists each NVIDIA
function exactly as /sys shows it (vendor, device, class, BAR sizes and flags, driver), and
takes nothing. Marked ``gpu`` (it wants the machine's NVIDIA GPU, held by its kernel driver);
skipped, saying why, elsewhere. /sys is read here directly, line by line, not through rig_pci.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rig_pci import Machine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"),
                       reason="no NVIDIA kernel driver here (/dev/nvidiactl is absent)"),
]
SYS = Path("/sys/bus/pci/devices")


def _hex(path: Path) -> int:
    return int(path.read_text().strip(), 16)


def test_this_machine_lists_nvidia_functions_as_sys_shows_them() -> None:
    nvidia = sorted(p.name for p in SYS.iterdir() if _hex(p / "vendor") == 0x10DE)
    assert nvidia, "the GPU machine has NVIDIA functions"
    listed = {f.address: f for f in Machine.this().functions()}
    for address in nvidia:
        d = SYS / address
        f = listed[address]
        assert (f.vendor, f.device, f.class_code) == (
            0x10DE, _hex(d / "device"), _hex(d / "class")), address
        driver = d / "driver"
        assert f.driver == (os.path.basename(os.readlink(driver)) if driver.exists() else None)
        # Each non-empty line of `resource` is a BAR (start end flags); rig_pci lists those.
        sizes = {}
        for index, line in enumerate((d / "resource").read_text().splitlines()[:6]):
            start, end, flags = (int(x, 16) for x in line.split())
            if end > start:
                sizes[index] = (end - start + 1, bool(flags & 0x2000))  # IORESOURCE_PREFETCH
        assert {b.index: (b.size, b.prefetchable) for b in f.bars} == sizes, address
        print(address, f"0x{f.device:04x}", f.driver,
              {i: f"{s >> 20} MiB" for i, (s, _) in sizes.items()})
    # Nothing was taken: every function keeps its driver.
    for address in nvidia:
        assert listed[address].driver == Machine.this().function(address).driver
