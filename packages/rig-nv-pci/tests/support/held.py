"""The simulated GPU as a taken function, opened through rig_nv_pci.held and through the
opener, and the helpers of the stop's and the GSP's silence tests."""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import firmware_builders as fb
import pytest
import sim
from sim.gsp_rm import SimRm

import rig_nv_pci
from rig_edge import Lost, Memory, Region
from rig_nv import Device
from rig_nv.rm import Allocation
from rig_nv_pci import held, lock
from rig_nv_pci.boot.stop import stop_gsp
from rig_nv_pci.firmware import chips
from rig_nv_pci.path import addresses
from rig_pci import FunctionInfo, Machine, Window, firmware, libc
from rig_pci.listing import Bar
from rig_pci.testing import inaccessible, mappings
from rig_pci.window import PlacedWindow
from support.boot import BOOTLOADER, FB_SIZE, GSP_IMAGE, Rig, stop_rig
from support.machine import add_gpu, here

BUS = "0000:41:00.0"


IORESOURCE_MEM = 0x200


class ViewWindow(Window):
    """A BAR range the simulated GPU shows as memory."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view), "simulated BAR")
        self.view = view

    def _read(self, offset: int, width: int) -> int:
        return int.from_bytes(self.view[offset:offset + width], "little")

    def _write(self, offset: int, width: int, value: int) -> None:
        self.view[offset:offset + width] = value.to_bytes(width, "little")

    def buffer(self) -> memoryview:
        return self.view

    def close(self) -> None:
        pass


@dataclass
class SimFunction:
    """The simulated GPU as a taken function: BAR 0 its registers, BARs 0 (usermode) and 1
    as memory, DMA from its host memory; taken physically on this machine, or through VFIO
    where it maps the host's memory (``maps_host``), as rig_pci.memory reads a function."""

    gpu: sim.SimGpu
    sim_rm: SimRm
    maps_host: bool = False
    closed: bool = False

    @property
    def bus(self) -> str:
        return BUS

    @property
    def machine(self) -> Machine:
        return Machine.this()

    @property
    def how(self) -> str:
        return "VFIO" if self.maps_host else "physically"

    @property
    def info(self) -> FunctionInfo:
        g = self.gpu
        bars = tuple(Bar(i, a, s, IORESOURCE_MEM) for i, a, s in (
            (0, g.bar0_address, 16 << 20), (1, g.bar1_address, self.sim_rm.bar1_size),
            (3, g.bar3_address, 32 << 20)))
        return FunctionInfo(BUS, 0x10DE, 0x2204, 0x030200, bars, None, None, "active")

    def window(self, bar: int, offset: int = 0, length: int | None = None, *,
               write_combined: bool = False, at: int | None = None) -> Window:
        if bar == 0 and offset == 0:
            return self.gpu.bar0()
        assert length is not None
        if at is not None:  # BAR 1 mapped there as rig_pci.Function.window(at=) maps it
            assert bar == 1
            self.sim_rm.bar1.place(offset, length, at)
            return PlacedWindow(at, length, "simulated BAR 1")
        return ViewWindow(self.sim_rm.bar(bar, offset, length))

    def alloc_dma(self, n: int, *, at: int | None = None) -> sim.SimDma:
        return self.gpu.host.alloc_dma(n, at=at)

    def map_host(self, address: int, length: int) -> sim.SimDma:
        return self.gpu.host.map_host(address, length)

    def bus_master(self, on: bool) -> bool:  # PCI_COMMAND's MASTER, bit 2; was it set
        was = bool(self.gpu.command & 0x4)
        self.gpu.command = self.gpu.command | 0x4 if on else self.gpu.command & ~0x4
        return was


def written(tmp: Path, files: dict[str, bytes]) -> dict[str, os.PathLike[str]]:
    """``files`` (firmware name -> bytes) written under ``tmp``; each name's path."""
    for name, data in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    return {name: tmp / name for name in files}


def images(tmp: Path, r: Rig, unload: fb.SyntheticBooter) -> dict[str, os.PathLike[str]]:
    """The four files of a GA102 boot, synthetic, under ``tmp``."""
    desc = {"version": 1, "monitorCodeOffset": 0, "monitorCodeSize": 0x1000,
            "monitorDataOffset": 0x1000, "monitorDataSize": 0x800, "manifestOffset": 0x1800,
            "manifestSize": 0x800, "appVersion": 0x5701}
    files = {
        chips.GSP_IMAGE: fb.build_gsp_elf(GSP_IMAGE, {"ga10x": b"\x5e" * 0x1000,
                                                      "ad10x": b"\x5f" * 0x1000}),
        "nvidia/ga102/gsp/bootloader-570.144.bin": fb.build_bootloader(BOOTLOADER, desc),
        "nvidia/ga102/gsp/booter_load-570.144.bin": r.sb.data,
        "nvidia/ga102/gsp/booter_unload-570.144.bin": unload.data,
    }
    return written(tmp, files)


@dataclass
class Opened:
    rig: Rig
    firmware: sim.GspFirmware
    sim_rm: SimRm
    function: SimFunction
    files: dict[str, os.PathLike[str]]
    stops: list[BaseException | None]
    kept: int = 0  # stops that kept the GPU (Device.dma gave bus ranges)

    def open(self) -> Device:
        chip = chips.identify(self.rig.gpu.boot42)
        return held.open_device(self.function, name="GPU 0", chip=chip,
                                images=held.read_images(chip, self.files),
                                on_stopped=self.stops.append, on_kept=self._kept,
                                timeout_s=0.2, init_timeout_s=1.0)

    def _kept(self) -> None:
        self.kept += 1


def simulated_ga102(tmp: Path, *, host: sim.HostMemory | None = None,
                    bar1_address: int | None = None, **sim_rm: int | list[int]) -> Opened:
    """A simulated GA102 to open, its PBDMA running (stop it with ``sim_rm.stop()``); GPUs
    given one ``host`` lie on one machine (its memory and bus), each at its ``bar1_address``;
    ``sim_rm`` as :class:`SimRm` takes it (``fb_size``, ``bar1_size``, ``retired``)."""
    r, firmware, _, unload = stop_rig(host=host)
    if bar1_address is not None:
        r.gpu.bar1_address = bar1_address
    r.gpu.usable_fb_mib = FB_SIZE >> 20
    s = SimRm(r.gpu, **sim_rm).install(firmware).start()
    return Opened(r, firmware, s, SimFunction(r.gpu, s), images(tmp, r, unload), [])


def every_use_is_lost(d: Device, region: Region) -> None:
    """After a fault: every use of ``d`` raises Lost (its facts still answer). (rig_nv's
    synchronize, with nothing left to wait for, returns without a look.)"""
    for use in (lambda: d.alloc(4096), lambda: d.upload(region, b"x"),
                lambda: d.copy(region, region, engine="copy"), lambda: d.sleep(0.0),
                lambda: d.download(region), d.step):
        with pytest.raises(Lost):
            use()
    assert d.facts.arch == "sm_86"


def copies(d: Device, n: int = 0x4000) -> None:
    """Fresh random bytes through Pinned and Device memory and the copy engine, byte-exact."""
    data = os.urandom(n)
    a, b = d.alloc(n, Memory.PINNED), d.alloc(n, Memory.DEVICE)
    assert a is not None and b is not None
    d.upload(a, data)
    d.copy(b, a, engine="copy").wait(timeout_s=5.0)
    assert bytes(d.download(b, n)) == data


def reopens(ga102: Opened) -> None:
    """The GPU opens again and copies as it should."""
    d = ga102.open()
    try:
        copies(d)
    finally:
        d.stop()


def bar1_window(low: int, high: int) -> bool:
    """Whether ``[low, high)`` of the process is wholly a shared mapping of the simulated
    video memory's file (a BAR 1 window placed there), with no hole."""
    at = low
    for m in mappings(low, high):
        if m.start > at or m.perms != "rw-s" or not m.path.startswith("/memfd:sim-vram"):
            return False
        at = m.end
    return at >= high


def all_reserved(free: list[tuple[int, int]]) -> bool:
    """Whether every free run of the process's range is reserved (inaccessible) in it."""
    return all(inaccessible(at, at + n) for at, n in free)


class OffsetWindow(Window):
    """A page of the simulated BAR 0 at ``base``, as the open's register reads take one."""

    def __init__(self, gpu: sim.SimGpu, base: int, length: int) -> None:
        super().__init__(length, f"simulated BAR 0 at 0x{base:x}")
        self.bar0, self.base = gpu.bar0(), base

    def _read(self, offset: int, width: int) -> int:
        return self.bar0.read(self.base + offset, width)

    def _write(self, offset: int, width: int, value: int) -> None:
        self.bar0.write(self.base + offset, width, value)

    def close(self) -> None:
        pass


@dataclass
class TakenSim(SimFunction):
    """:class:`SimFunction` as ``rig_nv_pci`` takes a function: closable, resettable, its bus
    mastering (PCI_COMMAND_MASTER) to turn off."""

    resets: int = 0
    memory_spaces: int = 0  # memory_space(True) calls (PCI_COMMAND's MEMORY, bit 1)

    @property
    def bus_mastering(self) -> bool:
        """Whether the simulated GPU's Bus Master Enable is set."""
        return self.gpu.bus_master()

    def window(self, bar: int, offset: int = 0, length: int | None = None, *,
               write_combined: bool = False, at: int | None = None) -> Window:
        if bar == 0 and offset not in (0, 0xBB0000):
            return OffsetWindow(self.gpu, offset, length or 0x1000)
        return super().window(bar, offset, length, write_combined=write_combined, at=at)

    def close(self) -> None:
        self.closed = True

    def memory_space(self, on: bool) -> bool:  # PCI_COMMAND's MEMORY, bit 1; was it set
        self.memory_spaces += on
        was = bool(self.gpu.command & 0x2)
        self.gpu.command = self.gpu.command | 0x2 if on else self.gpu.command & ~0x2
        return was

    def reset(self) -> None:  # rig_pci's reset turns bus mastering off, and Linux's restore
        self.bus_master(False)  # of the config space leaves it off; the GPU starts over
        self.resets += 1
        self.gpu.reset()


def machine_with_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, boot42: int,
                       files: dict[str, os.PathLike[str]]) -> Machine:
    """A fixture machine in ``tmp_path`` listing one NVIDIA GPU of ``boot42`` at :data:`BUS`,
    with the process's lock directory, firmware directories and kept GPUs there (a lost GPU
    is lost on its machine, which is ``tmp_path``'s own), and ``files`` (synthetic firmware)
    pinned as the firmware set's digests."""
    (tmp_path / "locks").mkdir()
    monkeypatch.setattr(lock, "directory", lambda: tmp_path / "locks")
    monkeypatch.setattr(firmware, "directory", lambda: tmp_path / "rig-firmware")
    monkeypatch.setattr(firmware, "SYSTEM", tmp_path / "lib-firmware")
    monkeypatch.setattr(rig_nv_pci.opener, "_kept", {})
    machine, _ = here(tmp_path / "machine")
    add_gpu(tmp_path / "machine", BUS, boot42=boot42)
    for name, path in files.items():
        digest = hashlib.blake2b(Path(path).read_bytes(), digest_size=32).hexdigest()
        monkeypatch.setitem(firmware.NVIDIA_GSP_570_144, name, digest)
    return machine


def opener(ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[Machine, list[TakenSim]]:
    """``rig_nv_pci.gpu(0, machine)`` opens the simulated GA102 (its lock, firmware and the
    process's lost and kept GPUs in ``tmp_path``); the functions it took (whose reset is the
    simulated GPU's function reset, sim/gpu.py SimGpu.reset)."""
    machine = machine_with_a_gpu(tmp_path, monkeypatch, ga102.rig.gpu.boot42, ga102.files)
    g = ga102.rig.gpu
    takes: list[TakenSim] = []

    def take(m: Machine, bus: str, name: str) -> TakenSim:
        takes.append(TakenSim(g, ga102.sim_rm))
        return takes[-1]

    monkeypatch.setattr(rig_nv_pci.opener, "_take", take)
    return machine, takes


GB202_CLASSES = (0x0080, 0x2080, 0x90F1, 0xA06C, 0x9067, 0xC661, 0xC761, 0xC86F, 0xC96F,
                 0xCA6F, 0xCBC0, 0xCDC0, 0xCEC0, 0xC8B5, 0xC9B5, 0xCAB5)


def gb202_files(tmp: Path) -> dict[str, os.PathLike[str]]:
    """A GB202's synthetic GSP image, bootloader and FMC, written under ``tmp``: name -> path."""
    from test_boot_fsp import FMC_FILE

    files = {
        chips.GSP_IMAGE: fb.build_gsp_elf(GSP_IMAGE, {"gb20x": b"\x5e" * 0x1000}),
        "nvidia/gb202/gsp/bootloader-570.144.bin": fb.build_bootloader(BOOTLOADER, {
            "version": 1, "monitorCodeOffset": 0, "monitorDataOffset": 0x1000,
            "manifestOffset": 0x1800, "appVersion": 0x0B57_0144}),
        "nvidia/gb202/gsp/fmc-570.144.bin": FMC_FILE,
    }
    return written(tmp, files)


def round_trip(d: Device) -> None:
    """Random bytes up to Pinned memory, copied to Device memory by the simulated copy
    engine, and read back."""
    data = os.urandom(0x5000)
    a, b = d.alloc(len(data), Memory.PINNED), d.alloc(len(data), Memory.DEVICE)
    assert a is not None and b is not None
    d.upload(a, data).wait(timeout_s=5.0)
    d.copy(b, a, engine="copy").wait(timeout_s=5.0)
    assert bytes(d.download(b)) == data
    d.free(a)
    d.free(b)


TIMEOUT_S = 0.5  # the RPC timeout here (10 s by default)


def silence(ga102: Opened, d: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RPCs' timeout TIMEOUT_S, the stop's wait for the GSP to suspend 0.05 s (a GSP that
    answers nothing never suspends: rig_nv_pci.boot.stop waits 2 s for it by default)."""
    assert isinstance(d.path, held.PciPath)
    monkeypatch.setattr(d.path.rm.rpc_rm.rpc, "timeout_s", TIMEOUT_S)
    monkeypatch.setattr(held, "stop_gsp", functools.partial(stop_gsp, suspend_timeout_s=0.05))


Span = tuple[int, int, Memory]  # GPU address, length, kind


def alloc_each(d: Device) -> list[Region]:
    """A small and a large region of every kind (the large Device one past the device's
    cache, so its free goes to the path at once)."""
    out = []
    for kind in Memory:
        for n in (0x3000, 3 << 20):
            r = d.alloc(n, kind)
            assert r is not None
            out.append(r)
    return out


def spans(d: Device) -> list[Span]:
    """Every allocation the device holds, its own (timeline, rings) too: the addresses its
    memory took from the process's range (not the channels' error notifiers, which the GPU
    reaches by bus address and so take no GPU address: PciPath.alloc_notifier's gpu 0)."""
    held_: list[Allocation] = [*d.memory.regions().values(), *d.memory.owned()]
    return [(a.gpu, a.length, a.kind) for a in held_ if a.gpu != 0]


def none_free(taken: list[Span]) -> bool:
    """Whether no address of ``taken`` is free in the process's range."""
    return not any(lo < at + n and at < lo + size
                   for at, n, _ in taken for lo, size in addresses.PROCESS.free)


def gsp_goes_silent(ga102: Opened, d: Device, monkeypatch: pytest.MonkeyPatch, *,
                    after_frees: int) -> None:
    """From the device's ``after_frees``-th RM free on, the simulated GSP answers nothing (its
    doorbell rings unheard, as a GSP that hung, or a GPU off the bus, leaves it): RPCs time
    out (in 0.2 s here) and it never suspends (the stop's wait cut to 0.05 s)."""
    assert isinstance(d.path, held.PciPath)
    monkeypatch.setattr(d.path.rm.rpc_rm.rpc, "timeout_s", 0.2)
    monkeypatch.setattr(held, "stop_gsp", functools.partial(stop_gsp, suspend_timeout_s=0.05))
    rm = d.path.rm
    real: Callable[[int], None] = rm.free
    frees = [0]

    def free(handle: int) -> None:
        if frees[0] == after_frees:
            ga102.firmware.suspended = True  # doorbell() returns without serving the queue
        frees[0] += 1
        real(handle)

    monkeypatch.setattr(rm, "free", free)
    if after_frees == 0:
        ga102.firmware.suspended = True


def give_back_for_good(before: list[tuple[int, int]]) -> None:
    """After a test that kept addresses: reserve again every address of the runs ``before``
    that is not free now and give it back to the process's range, as no stop does, so that
    later tests find the range as it was."""
    for lo, size in before:
        at = lo
        for free_at, n in [*addresses.PROCESS.free, (lo + size, 0)]:
            if free_at < lo or free_at > lo + size:
                continue
            if free_at > at:
                libc.reserve(at, free_at - at)
                addresses.PROCESS.give(at, free_at - at)
            at = max(at, free_at + n)

