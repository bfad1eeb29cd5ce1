"""A fixture sysfs tree with NVIDIA GPUs whose BAR 0 resource file holds the registers the
opener reads (NV_PMC_BOOT_42 at 0xA00, NV_PFB_PRI_MMU_WPR2_ADDR_LO/HI at 0x1FA824/0x1FA828:
nv_ref.h and tu102/dev_fb.h)."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

import firmware_builders
import pytest

import rig_nv_pci
from rig_nv_pci import lock
from rig_pci import Machine
from rig_pci.driver import Progress
from rig_pci.function import held as function_held
from rig_pci.testing import FixtureSysfs, add_function

BUS = "0000:01:00.0"


GA102, AD104, GB202 = 0x172A1000, 0x194A1000, 0x1B2A1000  # BOOT_42: arch 29:24, impl 23:20


BOOT_42, WPR2_LO, WPR2_HI = 0xA00, 0x1FA824, 0x1FA828  # nv_ref.h, tu102/dev_fb.h


PROM = 0x300000  # NV_PROM_DATA (nouveau shadowrom.c, nova-core vbios.rs)


VBIOS = firmware_builders.build_vbios().data


class Here(FixtureSysfs):
    """A fixture tree standing for this machine: its memory is the process's."""

    @property
    def shares_memory(self) -> bool:
        return True


def here(root: Path, **kwargs: object) -> tuple[Machine, Here]:
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/self/pagemap").touch()
    t = Here(root, **kwargs)  # type: ignore[arg-type]
    return Machine(t), t


def poke(dev: Path, offset: int, value: int, name: str = "resource0") -> None:
    with open(dev / name, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<I", value))


def add_gpu(root: Path, bus: str = BUS, *, boot42: int = GA102, wpr2: int = 0,
            **kwargs: object) -> Path:
    """An NVIDIA GPU (3D controller) with a 16 MiB BAR 0 whose BOOT_42 and WPR2 registers
    read ``boot42`` and ``wpr2``, and a 256 MiB BAR 1."""
    dev = add_function(root, bus, vendor=0x10DE, device=0x2204, class_code=0x030200,
                       bars={0: (0xF000_0000, 16 << 20, False), 1: (0xE000_0000, 256 << 20, True)},
                       **kwargs)  # type: ignore[arg-type]
    poke(dev, BOOT_42, boot42)
    poke(dev, WPR2_HI, wpr2)
    with open(dev / "resource0", "r+b") as f:  # a VBIOS with a FWSEC, in the PROM window
        f.seek(PROM)
        f.write(VBIOS)
    return dev


def given_back(machine: Machine, bus: str = BUS) -> None:
    """Nothing stays taken: not the function, not the GPU's lock (this process's or its file)."""
    assert not function_held(machine, bus) and not lock.held(machine, bus)
    fd = os.open(lock.path(machine, bus), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)



def as_this(machine: Machine) -> pytest.MonkeyPatch:
    """A monkeypatch under which ``machine`` stands for this machine (Machine.this), the one
    rig_nv_pci.detach and attach act on (the spec); undone by its ``undo``."""
    patch = pytest.MonkeyPatch()

    def this(cls: type[Machine]) -> Machine:
        return machine

    patch.setattr(Machine, "this", classmethod(this))
    return patch


def detach_on(machine: Machine, i: int = 0) -> Progress:
    """rig_nv_pci.detach(i), ``machine`` standing for this machine."""
    patch = as_this(machine)
    try:
        return rig_nv_pci.detach(i)
    finally:
        patch.undo()


def attach_on(machine: Machine, i: int = 0) -> None:
    """rig_nv_pci.attach(i), ``machine`` standing for this machine."""
    patch = as_this(machine)
    try:
        rig_nv_pci.attach(i)
    finally:
        patch.undo()
