"""A GPU the process took and boots: its firmware images read, its GSP booted, a rig_nv device
made over :class:`rig_nv_pci.path.pci.PciPath`, and the GSP stopped when the device stops.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/held.md."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rig_edge import Bus, RigError
from rig_nv import Device, make
from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import blackwell as boot_fsp
from rig_nv_pci.boot import gspmem
from rig_nv_pci.boot.stop import StopError, stop_gsp
from rig_nv_pci.firmware import chips, fwimage, layout
from rig_nv_pci.gsp import retired, rpc, sysinfo
from rig_nv_pci.gsp.events import EventError, EventLog
from rig_nv_pci.path import addresses, mmu, runlists, vidmem
from rig_nv_pci.path.allocations import Dma
from rig_nv_pci.path.host import Placement
from rig_nv_pci.path.pci import PciPath
from rig_nv_pci.path.rm import GspClient
from rig_pci import Function, FunctionInfo, Window
from rig_pci import memory as pci_memory

NV_USABLE_FB_SIZE_IN_MB = 0x001183A4
BAR0_SIZE = 16 << 20


class Taken(pci_memory.Taken, Protocol):
    """What the open needs of a taken function (rig_pci.Function): beside what
    rig_pci.memory reads of it for another device's access (``Device.dma``), its BARs and
    DMA memory."""

    @property
    def info(self) -> FunctionInfo: ...

    @property
    def maps_host(self) -> bool: ...

    def window(self, bar: int, offset: int = 0, length: int | None = None, *,
               write_combined: bool = False, at: int | None = None) -> Window: ...

    def alloc_dma(self, n: int, *, at: int | None = None) -> Dma | None: ...

    def map_host(self, address: int, length: int) -> Dma | None: ...

    def bus_master(self, on: bool) -> bool: ...


class FunctionBars:
    """A taken function's BARs as its path maps them (:class:`rig_nv_pci.path.host.Bars`):
    each view a window of its own, closed with it."""

    def __init__(self, f: Taken, name: str) -> None:
        self._f, self._name = f, name
        self._windows: dict[int, Window] = {}  # id of a view handed out -> its window

    def view(self, index: int, offset: int, length: int, at: int | None = None) -> memoryview:
        # BAR 1 (prefetchable) write-combined, as NVIDIA's driver maps it for the host; at
        # `at` of the process's reservation where asked (Mapped memory at its GPU address),
        # which the window's close puts back
        w = self._f.window(index, offset, length, write_combined=index == 1, at=at)
        buffer = getattr(w, "buffer", None)
        if buffer is None:
            w.close()
            raise RigError(f"{self._name}: BAR {index} cannot be mapped into the process (a "
                           "function taken through VFIO without mmap of its BARs)")
        view: memoryview = buffer()
        self._windows[id(view)] = w
        return view

    def close(self, view: memoryview) -> None:
        w = self._windows.pop(id(view), None)
        if w is not None:
            w.close()


class FunctionBus:
    """The bus ranges another device reaches a taken function's memory at, as rig_pci.memory
    states them (:class:`rig_nv_pci.path.host.BusRanges`)."""

    def __init__(self, f: Taken) -> None:
        self._f = f

    def bar(self, index: int, offset: int, length: int) -> Bus:
        return pci_memory.bus(self._f, index, offset, length)

    def dma(self, dma: Dma, offset: int, length: int) -> Bus:
        return pci_memory.dma_bus(self._f, dma, offset, length)


@dataclass(frozen=True)
class Images:
    """The firmware of a boot, read and parsed: the booters of a booter boot (Ampere, Ada),
    the FMC of an FSP boot (Blackwell; the boot parses it)."""

    gsp: fwimage.GspFirmware
    bootloader: fwimage.Bootloader
    booter_load: bytes = b""
    booter_unload: bytes = b""
    fmc: bytes = b""


def read_images(chip: chips.Chip, files: dict[str, os.PathLike[str]]) -> Images:
    """Read and parse ``chip``'s firmware ``files`` (its family's names to paths); raises
    :class:`rig_edge.RigError` naming the file that is not laid out as its format says."""
    family = chip.family

    def read(name: str) -> bytes:
        with open(files[name], "rb") as f:
            return f.read()

    try:
        gsp = fwimage.parse_gsp(read(family.gsp_image), str(files[family.gsp_image]))
        gsp.signature(fwimage.FAMILIES[family.name])
        bootloader = fwimage.parse_bootloader(read(family.bootloader),
                                              str(files[family.bootloader]))
        if family.fmc is not None:
            fmc = read(family.fmc)
            assert family.cot_version is not None
            fwimage.parse_fmc(fmc, str(files[family.fmc]), cot_version=family.cot_version)
            return Images(gsp, bootloader, fmc=fmc)
    except fwimage.FirmwareFormatError as e:
        raise RigError(f"a firmware file is not laid out as its format says: {e}") from e
    assert family.booter_load is not None and family.booter_unload is not None
    return Images(gsp, bootloader, read(family.booter_load), read(family.booter_unload))


def open_device(f: Taken, *, name: str, chip: chips.Chip, images: Images,
                on_stopped: Callable[[BaseException | None], None],
                on_kept: Callable[[], None] | None = None,
                on_memory_taken: Callable[[], None] | None = None,
                device_name: str | None = None, hang_ms: int | None = None,
                timeout_s: float = boot.GFW_TIMEOUT_S,
                init_timeout_s: float = boot.INIT_DONE_TIMEOUT_S,
                function: Function | None = None) -> Device:
    """Boot the GSP of the GPU behind ``f`` and make its device, named ``device_name`` (the
    opener's name; ``name``, which the boot's errors say, by default). ``function`` is the
    rig_pci function behind ``f`` (``f`` itself when it is one), which the device's peer
    mappings ask :func:`rig_pci.memory.why_apart` about. The device's stop (or a
    make that fails after the boot) stops the GSP, then calls ``on_stopped`` with the
    :class:`rig_nv_pci.boot.stop.StopError` that left the GPU lost, else the
    :class:`rig_nv_pci.gsp.sequencer.SequencerError` of a sequence the GSP asked for while the
    device ran that failed or was cut short (which lost the GPU), or ``None``; a stop after
    ``Device.dma`` handed out bus ranges stops nothing and calls ``on_kept`` instead (the
    memory and the GPU stay the process's, :meth:`rig_nv_pci.path.pci.PciPath.closed`). The
    stop of a device whose GSP stopped answering (an RPC timed out: no later one is sent,
    :class:`rig_nv_pci.gsp.rpc.Rpc`) returns, the GSP's failed stop going to ``on_stopped``
    as for any lost GPU; the device's memory and addresses stay kept. ``on_memory_taken`` is
    called once the GSP's memory is taken: whatever ends the open after it (a KeyboardInterrupt
    among them) loses the GPU, the caller's to record. Raises
    :class:`rig_edge.RigError` naming ``name`` (the GSP stopped again where it booted); first,
    before the GPU is touched, where the process's addresses cannot be reserved
    (:mod:`rig_nv_pci.path.addresses`)."""
    try:
        reserved = addresses.PROCESS.addresses()
    except RigError as e:
        raise RigError(f"{name}: {e}") from e
    bar0 = f.window(0, 0, BAR0_SIZE)
    fb_mib = bar0.read32(NV_USABLE_FB_SIZE_IN_MB)
    if fb_mib in (0, 0xFFFFFFFF):
        raise RigError(f"{name}: NV_USABLE_FB_SIZE_IN_MB reads 0x{fb_mib:x}: the boot ROM did "
                       "not report the GPU's memory")
    bl = images.bootloader
    image = images.gsp.image.data
    family = chip.family
    fsp_boot = family.boot == "fsp"
    plan = (layout.fmc_sizes(family, fb_mib << 20) if fsp_boot else
            layout.fb_layout(family, fb_mib << 20, len(image), len(bl.image)))
    # Bus mastering on before the boot's first DMA (the falcons' loads of FWSEC and the
    # booter, the GSP's reads of its arguments and queues): with Bus Master Enable clear the
    # function issues no memory requests (PCIe Base 6.0 7.5.1.1.3), and Linux leaves it clear
    # after an unbind (pci_disable_device) or vfio-pci's open, as rig_pci's reset does. So
    # nova-core's probe (pdev.set_master(), drivers/gpu/nova-core/driver.rs), nouveau
    # (pci_set_master in nvkm_device_pci_preinit, nvkm/engine/device/pci.c) and tinygrad's
    # PCI path (PCI_COMMAND |= PCI_COMMAND_MASTER before its NVDev boots the GSP,
    # tinygrad/runtime/ops_nv.py) turn it on.
    try:
        f.bus_master(True)
    except RigError as e:
        raise RigError(f"{name}: {e}") from e
    try:
        memory = gspmem.build(
            f.alloc_dma, image=image, bootloader=bl.image, code_offset=bl.desc.monitor_code_offset,
            data_offset=bl.desc.monitor_data_offset, manifest_offset=bl.desc.manifest_offset,
            signature=images.gsp.signature(fwimage.FAMILIES[chip.family.name]).data, plan=plan,
            doorbell=boot.doorbell(bar0), name=name)
        if on_memory_taken is not None:
            on_memory_taken()
        system = sysinfo.SystemInfo.for_function(f.info, fsp_boot=fsp_boot)
        log = EventLog(name)

        def on_event(event: rpc.Incoming) -> None:
            try:
                log.take(event)
            except EventError as e:  # kept as a line: a garbled event must not fail an RPC
                log.lines.append(str(e))
        if fsp_boot:
            booted = boot_fsp.boot_fsp(bar0, name=name, family=family, fmc=images.fmc,
                                       memory=memory, alloc=f.alloc_dma, system=system,
                                       app_version=bl.desc.app_version, timeout_s=timeout_s,
                                       init_timeout_s=init_timeout_s, on_event=on_event)
        else:
            booted = boot.boot_gsp(bar0, name=name, booter_load=images.booter_load, memory=memory,
                                   alloc=f.alloc_dma, system=system,
                                   app_version=bl.desc.app_version, timeout_s=timeout_s,
                                   init_timeout_s=init_timeout_s, on_event=on_event)
    except BaseException:
        # The GSP's memory refused, or the boot failed once the GSP may have started: bus
        # mastering off before the function's release frees the memory the GSP may still
        # write, as a lost GPU's stop turns it off (rig_nv_pci.gpu). A function off the bus
        # may refuse: released regardless.
        with contextlib.suppress(RigError, OSError):
            f.bus_master(False)
        raise
    # From here on a GSP_RUN_CPU_SEQUENCER that fails or is cut short loses the GPU: the
    # device raises it from its next wait or sleep (PciPath.fault), or at once once the device
    # exists (below), and its stop leaves the GPU lost, so that the next open resets it first.
    booted.sequencers.runtime(log.lose)
    # Likewise a GSP that stopped answering (an RPC timed out, the queues failed): no later RPC
    # is sent (rig_nv_pci.gsp.rpc.Rpc), the device is lost at once once it exists (below),
    # and its stop, unable to unload the GSP, leaves the GPU lost.
    booted.channel.on_silent = log.lose

    def stop() -> None:
        failure: BaseException | None = None
        try:
            if fsp_boot:
                stop_gsp(bar0, booted, name=name, family=family, timeout_s=timeout_s)
            else:
                stop_gsp(bar0, booted, name=name, booter_unload=images.booter_unload,
                         alloc=f.alloc_dma, timeout_s=timeout_s)
        except StopError as e:
            failure = e if e.lost else None
        on_stopped(failure or booted.sequencers.lost)

    bars = FunctionBars(f, name)

    bar1_size = next((b.size for b in f.info.bars if b.index == 1), 0)
    try:
        # the GPU's retired pages, asked before the heap exists as heapInit_IMPL asks them
        # (memmgrGetBlackListPages_GA100); a refusal other than "none" or a garbled list
        # fails the open (rig_nv_pci.gsp.retired)
        pages = retired.get_retired(booted.channel, booted.static)
        # which runlist each engine is on, as CPU-RM reads it (kfifoGetHostDeviceInfoTable_
        # KERNEL, GSP-RM's internal client and subdevice): the channels' doorbell tokens
        internal = rpc.RpcRM(booted.channel, booted.static.internal_client)
        table = runlists.get(lambda p: internal.control(
            booted.static.internal_subdevice,
            runlists.NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE, p))
        path = PciPath(
            device_name or name, f.info.address,
            GspClient(booted.rm, poll=booted.channel.poll, events=log),
            bars=bars, memory=f, hang_ms=hang_ms, on_closed=stop, on_kept=on_kept,
            fb=vidmem.FbLayout(
                booted.static.fb_regions,
                # BAR 1's tables under GSP-RM's root, from BAR 1 offset 0, as CPU-RM rebuilds
                # them for a GSP client (kbusPatchBar1Pdb_GSPCLIENT); tinygrad puts BAR 1 in
                # physical mode instead, which CPU-RM never does
                bar1=(booted.static.bar1_pde_base, bar1_size),
                # GSP-RM's BAR 2 root, never heap memory (kbusPatchBar2Pdb_GSPCLIENT), nor the
                # retired pages' 64 KiB frames (pmaRegisterBlacklistInfo)
                kept=[*vidmem.roots(booted.static.bar2_pde_base),
                      *vidmem.retired(p.address for p in pages)],
                # what map_peer asks rig_pci.memory.why_apart: the GPU's memory, all of which
                # its BAR 1 must reach (the spec)
                size=fb_mib << 20),
            # the page tables written through PRAMIN: Blackwell's in Hopper's version-3
            # format (kgmmuFmtFamiliesInit_GH100)
            pramin=bar0, mmu_format=mmu.VER3 if fsp_boot else mmu.VER2,
            # GPU addresses from the process's range, Pinned memory and Mapped memory's BAR 1
            # windows at their own (Pinned memory in 2 MiB huge pages when taken physically,
            # rig_pci.Function.alloc_dma)
            placement=Placement(reserved, mmu.PAGE if f.maps_host else mmu.HUGE_PAGE),
            # what another device reaches (Device.dma), as rig_pci.memory states
            bus_ranges=FunctionBus(f),
            # and the function map_peer asks rig_pci.memory.why_apart about
            function=function if function is not None else
            f if isinstance(f, Function) else None,
            # the device's clock: PTIMER's registers (Rig_nv.clock.Registers)
            timer=bar0,
            doorbells=runlists.Doorbells(device_name or name, table, family.runlist_doorbell))
    except BaseException:
        stop()
        raise
    device = make(path)

    def lose(why: object) -> None:
        # From here on the GSP's silence, and a sequence GSP-RM asks for that fails or is cut
        # short, lose the device at once, not at its next wait or sleep: no launch or copy
        # goes to the lost GPU. Called inside the RPC or the poll that found it, on whatever
        # thread: Device.mark_lost takes no lock (its docstring says why), and EventLog.lose
        # only its own, which no caller of an RPC holds.
        device.mark_lost(log.lose(why))

    booted.channel.on_silent = lose
    booted.sequencers.runtime(lose)
    if log.lost is not None:  # a loss while the device was made (none comes between)
        device.mark_lost(log.lost)
    return device
