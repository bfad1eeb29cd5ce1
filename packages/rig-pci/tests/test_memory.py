"""rig_pci.memory on fixture trees: BAR and DMA memory bus ranges, and whether two functions
reach each other across a switch (with and without ACS redirect) or only through the root
complex."""

import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from rig_edge import Bus, Misuse
from rig_pci import Function, FunctionInfo, Machine, memory
from rig_pci.dma import DmaMemory
from rig_pci.sysfs import SysfsTransport
from rig_pci.testing import add_function, config_space

GiB = 1 << 30


def bridge_config(acs_control: int | None) -> bytes:
    """A PCIe port's 4 KiB config space, with an ACS capability at 0x100 when asked
    (pci_regs.h: extended header id 0x000d, version 1, no next; control at +6)."""
    cfg = bytearray(config_space(0x8086, 0x1234, 0x060400).ljust(4096, b"\0"))
    if acs_control is not None:
        struct.pack_into("<IHH", cfg, 0x100, 0x0001_000D, 0x005F, acs_control)
    return bytes(cfg)


def add_gpu(root: Path, address: str, parent: str | None) -> None:
    add_function(
        root,
        address,
        vendor=0x10DE,
        device=0x2684,
        class_code=0x030000,
        bars={0: (0xF000_0000, 16 << 20, False), 1: (0x40_0000_0000, 32 * GiB, True)},
        parent=parent,
    )


def add_bridge(root: Path, address: str, parent: str | None, acs: int | None = None) -> None:
    add_function(
        root, address, vendor=0x8086, device=0x1234, class_code=0x060400,
        parent=parent, config=bridge_config(acs),
    )


def switch_tree(root: Path, acs: int | None = None) -> None:
    """Root port 00:01.0 → switch upstream 01:00.0 → downstream 02:00.0 and 02:01.0, a GPU
    below each (03:00.0, 04:00.0); and a third GPU on root port 00:02.0 (05:00.0)."""
    add_bridge(root, "0000:00:01.0", None)
    add_bridge(root, "0000:01:00.0", "0000:00:01.0")
    add_bridge(root, "0000:02:00.0", "0000:01:00.0", acs)
    add_bridge(root, "0000:02:01.0", "0000:01:00.0", acs)
    add_gpu(root, "0000:03:00.0", "0000:02:00.0")
    add_gpu(root, "0000:04:00.0", "0000:02:01.0")
    add_bridge(root, "0000:00:02.0", None)
    add_gpu(root, "0000:05:00.0", "0000:00:02.0")


def test_gpus_below_one_switch_reach_each_other(tmp_path: Path) -> None:
    switch_tree(tmp_path, acs=0x0001)  # Source Validation only: no redirect
    m = Machine.at(tmp_path)
    gpus = [f.address for f in m.functions() if f.vendor == 0x10DE]
    assert gpus == ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0"]
    with Function.take(m, "0000:03:00.0") as a, Function.take(m, "0000:04:00.0") as b:
        assert memory.reaches(a, b, bar=1, memory=(24 * GiB, 32 * GiB))
        assert not memory.reaches(a, b, bar=1, memory=(48 * GiB, 32 * GiB))  # BAR too small


def test_acs_redirect_or_the_root_complex_keeps_them_apart(tmp_path: Path) -> None:
    switch_tree(tmp_path, acs=0x001D)  # RR | CR | UF | SV: what Linux sets for isolation
    m = Machine.at(tmp_path)
    with Function.take(m, "0000:03:00.0") as a, Function.take(m, "0000:04:00.0") as b:
        assert not memory.reaches(a, b, bar=1, memory=(GiB, GiB))
        assert "ACS" in str(memory.why_apart(a, b, bar=1, memory=(GiB, GiB)))
    with Function.take(m, "0000:03:00.0") as a, Function.take(m, "0000:05:00.0") as c:
        assert "root complex" in str(memory.why_apart(a, c, bar=1, memory=(GiB, GiB)))


def test_bus_ranges_of_a_bar(tmp_path: Path) -> None:
    switch_tree(tmp_path)
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/pagemap").touch()
    here = Machine(SysfsTransport(tmp_path, shares_memory=True))
    with Function.take(here, "0000:03:00.0") as f:
        assert memory.bus(f, 1, 0x1000, 0x2000) == Bus(ranges=((0x40_0000_1000, 0x2000),))
        with pytest.raises(Misuse):
            memory.bus(f, 1, 32 * GiB - 0x1000, 0x2000)
    with Function.take(Machine.at(tmp_path), "0000:03:00.0") as f:
        reason = memory.bus(f, 1, 0, 0x1000).reason
        assert reason is not None and "not this machine" in reason


@dataclass
class Vfio:
    """A function as taken through VFIO, for what rig_pci.memory reads of it."""

    bus: str
    info: FunctionInfo
    machine: Machine
    how: str = "VFIO"
    closed: bool = False


def test_bus_ranges_of_dma_memory(tmp_path: Path) -> None:
    """Taken physically: the memory's bus addresses (physical ones), page by page, adjacent
    runs joined, from any offset; behind an IOMMU, on another machine or outside the memory:
    the reason, or Misuse."""
    switch_tree(tmp_path)
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/pagemap").touch()
    here = Machine(SysfsTransport(tmp_path, shares_memory=True))
    # three huge pages: the first two physically adjacent, the third elsewhere
    dma = DmaMemory(0x7F00_0000_0000, 6 << 20, ((0x1_0000_0000, 4 << 20),
                                                (0x3_0020_0000, 2 << 20)), lambda: None)
    with Function.take(here, "0000:03:00.0") as f:
        assert memory.dma_bus(f, dma, 0, 6 << 20) == Bus(ranges=(
            (0x1_0000_0000, 4 << 20), (0x3_0020_0000, 2 << 20)))
        assert memory.dma_bus(f, dma, (4 << 20) - 0x10, 0x20) == Bus(ranges=(
            (0x1_0000_0000 + (4 << 20) - 0x10, 0x10), (0x3_0020_0000, 0x10)))
        assert memory.dma_bus(f, dma, 0x123, 0x2000) == Bus(ranges=(
            (0x1_0000_0123, 0x2000),))
        with pytest.raises(Misuse):
            memory.dma_bus(f, dma, (6 << 20) - 0x1000, 0x2000)
        vfio = Vfio(f.bus, f.info, here)
        reason = memory.dma_bus(vfio, dma, 0, 0x1000).reason
        assert reason is not None and "through VFIO" in reason and "IOMMU domain" in reason
        assert memory.bus(vfio, 1, 0, 0x1000).reason is not None
    with pytest.raises(Misuse, match="released"):
        memory.dma_bus(f, dma, 0, 0x1000)
    with Function.take(Machine.at(tmp_path), "0000:03:00.0") as f:
        reason = memory.dma_bus(f, dma, 0, 0x1000).reason
        assert reason is not None and "not this machine" in reason
