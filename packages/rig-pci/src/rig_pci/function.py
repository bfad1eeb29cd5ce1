"""A PCI function this process holds: config space, BAR windows, DMA memory, reset.

``Function.take(machine, bus)`` takes it through the machine's transport: on a sysfs machine
behind an IOMMU through VFIO (:mod:`rig_pci.vfio` states the group's rules), otherwise
physically (:class:`rig_pci.sysfs.PhysicalAccess`). A taken function is released exactly
once: by :meth:`Function.close` (again and again, harmlessly), by leaving its ``with`` block,
or when it is collected.
"""

from __future__ import annotations

import mmap
import threading
import time
import weakref
from types import TracebackType

from rig_edge import Misuse, RigError
from rig_pci.dma import DmaMemory
from rig_pci.listing import IORESOURCE_MEM, Bar, FunctionInfo
from rig_pci.machine import Machine
from rig_pci.transport import Access
from rig_pci.window import Window, all_ones

# Linux include/uapi/linux/pci_regs.h
PCI_VENDOR_ID = 0x00
PCI_COMMAND = 0x04
PCI_COMMAND_MEMORY = 0x2
PCI_COMMAND_MASTER = 0x4

RESET_TIMEOUT_S = 1.0  # PCIe r6.0 6.6.1: a function answers config requests 1 s after a reset

_held: set[tuple[str, str]] = set()
_held_lock = threading.Lock()


def round_up(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return -(-n // to) * to


def held(machine: Machine, bus: str) -> bool:
    """Whether this process holds the function at ``bus`` of ``machine`` (a :class:`Function`
    not yet released)."""
    with _held_lock:
        return (machine.name, bus) in _held


class _Holding:
    """What a taken function holds, released once (by close or by the collector)."""

    def __init__(self, key: tuple[str, str], access: Access) -> None:
        self.key = key
        self.access = access
        self.windows: list[Window] = []
        self.dma: list[DmaMemory] = []

    def release(self) -> None:
        first: RigError | None = None
        for memory in self.dma:
            try:
                memory.free()
            except RigError as e:  # the device may still reach it: it stays the process's
                first = first or e
        for window in self.windows:
            window.close()
        self.access.close()
        with _held_lock:
            _held.discard(self.key)
        if first is not None:
            raise first


class ResetFailed(RigError):
    """A reset of a function was attempted and failed: Linux's (or VFIO's) reset refused, or
    the function did not answer after it. Unlike the other refusals of
    :meth:`Function.reset` and :func:`rig_pci.driver.attach` (no reset Linux knows, a function
    that cannot be taken), which change nothing, the function may be left in any state."""


class Function:
    """A PCI function this process holds. Take one with :meth:`take`.

    ``bus`` is its address, ``info`` what the machine listed of it, ``how`` how it was taken
    (``"VFIO"``, ``"physically"``, or a transport's word), ``maps_host`` whether the device can
    be given the process's own memory (behind an IOMMU) or only :meth:`alloc_dma` memory
    (physically, where a dead process's pages would go back to the system with the device
    still writing them).
    """

    def __init__(self, machine: Machine, info: FunctionInfo, access: Access) -> None:
        self.machine = machine
        self.bus = info.address
        self.info = info
        self._access = access
        self._holding = _Holding((machine.name, info.address), access)
        self._release = weakref.finalize(self, self._holding.release)
        self._lock = threading.Lock()
        self.config = access.config()

    @classmethod
    def take(cls, machine: Machine, bus: str) -> Function:
        """Take the function at ``bus`` of ``machine`` for this process.

        On a sysfs machine: through VFIO when it is bound to vfio-pci (its IOMMU group viable,
        /dev/vfio/N granted), physically when no driver holds it and no IOMMU translates for
        it (the kernel not locked down, its sysfs files writable, and on this machine
        /proc/self/pagemap readable).

        Raises :class:`rig_edge.RigError` naming the function and the reason when it cannot
        be taken: this process holds it already, another driver or process holds it, its group
        is not viable, its files cannot be opened. Raises :class:`rig_edge.Misuse` if ``bus``
        is no bus address.
        """
        info = machine.function(bus)
        key = (machine.name, bus)
        where = f"{bus} of {machine.name} cannot be taken"
        with _held_lock:
            if key in _held:
                raise RigError(f"{where}: this process holds it already")
            _held.add(key)
        try:
            access = machine.transport.take(bus)
        except RigError as e:
            with _held_lock:
                _held.discard(key)
            raise RigError(f"{where}: {e}") from e
        except BaseException:
            with _held_lock:
                _held.discard(key)
            raise
        try:
            return cls(machine, info, access)
        except BaseException:
            access.close()
            with _held_lock:
                _held.discard(key)
            raise

    def __repr__(self) -> str:
        state = "released" if self.closed else self.how
        return f"Function({self.bus} of {self.machine.name}, {state})"

    @property
    def how(self) -> str:
        """How the function was taken: ``"VFIO"``, ``"physically"``, or a transport's word."""
        return self._access.how

    @property
    def maps_host(self) -> bool:
        """Whether the device can reach host memory mapped for it (only behind an IOMMU)."""
        return self._access.maps_host

    @property
    def closed(self) -> bool:
        """Whether the function was released."""
        return not self._release.alive

    def _check(self, what: str) -> None:
        if self.closed:
            raise Misuse(f"{what}: {self.bus} was released")

    def close(self) -> None:
        """Release the function: free its DMA memory, unmap its windows, close its files.

        Runs once; later calls do nothing. Raises :class:`rig_edge.RigError` (once everything
        else is released) if the device's mapping of some DMA memory could not be removed:
        that memory then stays the process's, since the device may still reach it.
        """
        self._release()

    def __enter__(self) -> Function:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _bar(self, index: int) -> Bar:
        for bar in self.info.bars:
            if bar.index == index and bar.flags & IORESOURCE_MEM:
                return bar
        raise Misuse(f"{self.bus} has no memory BAR {index}")

    def window(
        self,
        bar: int,
        offset: int = 0,
        length: int | None = None,
        *,
        write_combined: bool = False,
        at: int | None = None,
    ) -> Window:
        """A window onto ``length`` bytes of memory BAR ``bar`` from ``offset`` (to the BAR's
        end by default), for exact-width register reads and writes.

        ``offset`` must be page-aligned; ``length`` is rounded up to whole pages.
        ``write_combined`` maps a prefetchable BAR write-combined where Linux offers it
        (sysfs ``resourceN_wc``), uncached elsewhere (VFIO maps uncached whatever is asked).

        ``at`` maps the window at that address of the process (a
        :class:`rig_pci.window.PlacedWindow`, ``MAP_FIXED``), so that the BAR's bytes lie where
        the caller wants them (a GPU's memory BAR at the memory's GPU address): the range
        ``[at, at+length)`` must be one the caller reserved with an inaccessible mapping,
        which the window replaces, and ``at`` and ``length`` must be page-aligned (not
        rounded: rounding would map over memory the caller did not offer). Closing the window
        (or releasing the function) puts the reservation back (``PROT_NONE``, ``MAP_FIXED``
        anonymous ``MAP_NORESERVE``), so the range stays the caller's. A VFIO region VFIO
        does not let the process map cannot be placed.

        The window is unmapped when the function is released. Raises
        :class:`rig_edge.Misuse`, having mapped nothing, for a BAR the function lacks, a range
        outside it, or an ``at`` or ``length`` not page-aligned with ``at``;
        :class:`rig_edge.RigError` if it cannot be mapped (where ``at`` was given, with the
        reservation put back).
        """
        self._check("window")
        b = self._bar(bar)
        size = round_up(b.size, mmap.PAGESIZE)  # Linux maps a BAR smaller than a page whole
        if length is None:
            length = size - offset
        elif at is None:
            length = round_up(length, mmap.PAGESIZE)
        if offset < 0 or offset % mmap.PAGESIZE or length <= 0 or offset + length > size:
            raise Misuse(
                f"{self.bus} BAR {bar}: 0x{length:x} bytes at 0x{offset:x} do not lie "
                f"page-aligned in its 0x{b.size:x} bytes"
            )
        if at is None:
            w = self._access.window(bar, offset, length, write_combined)
        else:
            if at <= 0 or at % mmap.PAGESIZE or length % mmap.PAGESIZE:
                raise Misuse(
                    f"{self.bus} BAR {bar}: a window is placed at a page-aligned address with "
                    f"a length of whole pages, not 0x{length:x} bytes at 0x{at:x} (pages of "
                    f"0x{mmap.PAGESIZE:x} bytes)"
                )
            # `at` goes only to a transport asked to place a window (see Access.window).
            w = self._access.window(bar, offset, length, write_combined, at=at)
        with self._lock:
            self._holding.windows.append(w)
        return w

    def alive(self) -> bool:
        """Whether the function answers: its vendor id does not read all-ones, as a function
        does that was removed, is in reset or fell off the bus (and then drops writes)."""
        self._check("alive")
        try:
            return not all_ones(self.config.read16(PCI_VENDOR_ID), 2)
        except RigError:
            return False

    def memory_space(self, on: bool) -> bool:
        """Let the function answer requests to its memory BARs (Memory Space Enable, bit 1 of
        its command register) or not; returns whether it did before.

        With the bit clear a function answers no memory request to its BARs (PCIe Base 6.0
        7.5.1.1.3; reads through its windows then see all-ones). Linux sets it when a driver
        enables the function (pci_enable_device, as vfio-pci's open does, or a write of 1 to
        its sysfs ``enable``), and its reset restores it as it was; a function no driver
        enabled since the machine started may have it clear. Raises
        :class:`rig_edge.RigError` if it reads back clear after being turned on."""
        return self._command(PCI_COMMAND_MEMORY, on, "memory_space", "memory space decoding")

    def bus_master(self, on: bool) -> bool:
        """Let the function start DMA (Bus Master Enable, bit 2 of its command register) or
        not; returns whether it could before.

        With the bit clear the function issues no memory requests (PCIe Base 6.0 7.5.1.1.3):
        a device's DMA, of its firmware's arguments or of anything else, goes nowhere. Linux
        clears it when a driver lets a function go (pci_disable_device) and when vfio-pci
        opens or resets it, and :meth:`reset` turns it off, so whoever takes a function
        turns it on before its first DMA (a driver's pci_set_master). Raises
        :class:`rig_edge.RigError` if it reads back clear after being turned on; turning it
        off checks nothing (a function off the bus reads all-ones)."""
        return self._command(PCI_COMMAND_MASTER, on, "bus_master", "bus mastering")

    def _command(self, bit: int, on: bool, what: str, name: str) -> bool:
        """Set or clear ``bit`` of the command register; whether it was set before."""
        self._check(what)
        command = self.config.read16(PCI_COMMAND)
        want = command | bit if on else command & ~bit
        if want != command:
            self.config.write16(PCI_COMMAND, want)
        if on:
            now = self.config.read16(PCI_COMMAND)
            if not now & bit:
                raise RigError(f"{self.bus}: its {name} stays off (its command register "
                               f"reads 0x{now:04x} after 0x{want:04x} was written)")
        return bool(command & bit)

    def _dma_allowed(self, what: str) -> None:
        self._check(what)
        if not self.machine.is_this:
            raise RigError(
                f"{what} for {self.bus}: {self.machine.name}'s memory is not this process's, "
                "so its functions cannot reach it"
            )

    def alloc_dma(self, n: int, *, at: int | None = None) -> DmaMemory | None:
        """``n`` bytes (rounded up to the granule) of zeroed, locked memory the device
        reaches, with the bus addresses it lies at, or ``None`` when out of it.

        Behind an IOMMU the memory is pinned and mapped by VFIO, counts against the process's
        RLIMIT_MEMLOCK, and is ``None`` once that is reached (raise the limit to allocate
        more); the granule is a page. Physically it lies in 2 MiB huge pages, ``None`` once
        none is free (reserve more with vm.nr_hugepages); reading their bus addresses from
        /proc/self/pagemap needs CAP_SYS_ADMIN.

        ``at`` places the memory at that address of the process (a range the caller reserved
        with an inaccessible mapping, aligned to the granule); freeing it puts the reservation
        back. Raises :class:`rig_edge.Misuse` if ``n`` is not positive or ``at`` is unaligned,
        :class:`rig_edge.RigError` if the machine's memory is not this process's or the
        memory's bus addresses cannot be read.
        """
        if n <= 0:
            raise Misuse(f"alloc_dma: the length must be positive, not {n}")
        granule = self._access.dma_granule
        if at is not None and at % granule:
            raise Misuse(f"alloc_dma: 0x{at:x} is not aligned to 0x{granule:x}")
        self._dma_allowed("alloc_dma")
        memory = self._access.alloc_dma(round_up(n, granule), at)
        if memory is not None:
            with self._lock:
                self._holding.dma.append(memory)
        return memory

    def map_host(self, address: int, length: int) -> DmaMemory | None:
        """Map ``length`` bytes of the process's own memory at ``address`` (page-aligned) for
        the device, at the same bus address; ``None`` once RLIMIT_MEMLOCK is reached.

        Only behind an IOMMU (:attr:`maps_host`); raises :class:`rig_edge.RigError` for a
        function taken physically, :class:`rig_edge.Misuse` for an unaligned range.
        """
        if address % mmap.PAGESIZE or length <= 0 or length % mmap.PAGESIZE:
            raise Misuse(f"map_host: 0x{length:x} bytes at 0x{address:x} are not whole pages")
        self._dma_allowed("map_host")
        memory = self._access.map_host(address, length)
        if memory is not None:
            with self._lock:
                self._holding.dma.append(memory)
        return memory

    @property
    def can_reset(self) -> bool:
        """Whether Linux has a reset for the function (its sysfs ``reset`` file, or VFIO's
        reset): :meth:`reset` of one that has none changes nothing."""
        return self._access.can_reset

    def reset(self, timeout_s: float = RESET_TIMEOUT_S) -> None:
        """Reset the function: turn its bus mastering off (so Linux's restore of its config
        space leaves it off), reset it as Linux does (its sysfs ``reset``, or VFIO's reset),
        and wait up to ``timeout_s`` seconds until its vendor id reads other than all-ones.

        Raises :class:`rig_edge.RigError`, having changed nothing, when Linux has no reset for
        it; and :class:`ResetFailed` (a RigError) when the reset was attempted and failed or
        the function does not answer after it.
        """
        self._check("reset")
        if not self._access.can_reset:
            raise RigError(f"{self.bus} cannot be reset: Linux has no reset for it")
        if self.alive():
            self.bus_master(False)
        try:
            self._access.reset()
        except RigError as e:
            raise ResetFailed(f"{self.bus}: its reset failed: {e}") from e
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while not self.alive():
            if time.monotonic() >= deadline:
                raise ResetFailed(
                    f"{self.bus} does not respond after its reset: its vendor id read "
                    f"0xffff for {timeout_s:g} s"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
