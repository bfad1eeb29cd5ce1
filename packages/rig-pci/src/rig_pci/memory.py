"""Memory that other devices reach: the bus ranges of memory behind a BAR and of DMA memory,
and whether two functions' BARs reach each other (peer to peer).

A function's BAR answers requests at its bus address whoever sends them, but whether a request
from another device gets there depends on the path: requests that meet in a PCIe switch go
across it, unless a port on the way redirects them upstream (ACS, PCIe r6.0 6.12); requests
that meet only in the root complex go through the host bridge, which many do not forward
between ports. rig answers as Linux's own p2pdma does (drivers/pci/p2pdma.c), more strictly:
the two must meet in a switch with no ACS redirect on the way; meeting in the root complex
counts as not reaching (Linux trusts a short list of host bridges there, rig none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from rig_edge import Bus, Misuse
from rig_pci.function import Function
from rig_pci.listing import Bar, FunctionInfo, parse_address
from rig_pci.machine import Machine
from rig_pci.sysfs import SysfsTransport

# Linux include/uapi/linux/pci_regs.h
PCI_CFG_SPACE_SIZE = 256
PCI_EXT_CAP_ID_ACS = 0x0D
PCI_ACS_CTRL = 0x06
PCI_ACS_RR = 0x0004  # P2P Request Redirect
PCI_ACS_CR = 0x0008  # P2P Completion Redirect
PCI_ACS_EC = 0x0020  # P2P Egress Control
ACS_REDIRECTS = PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC  # p2pdma.c: pci_bridge_has_acs_redir


class Taken(Protocol):
    """What :func:`bus` and :func:`dma_bus` read of a taken function (a
    :class:`rig_pci.Function`): its address, what was listed of it, its machine, how it was
    taken and whether it was released."""

    @property
    def bus(self) -> str: ...

    @property
    def info(self) -> FunctionInfo: ...

    @property
    def machine(self) -> Machine: ...

    @property
    def how(self) -> str: ...

    @property
    def closed(self) -> bool: ...


class Dma(Protocol):
    """DMA memory a function reaches (a :class:`rig_pci.DmaMemory`): its length and the bus
    address of each of its bytes."""

    @property
    def length(self) -> int: ...

    def bus_address(self, offset: int) -> int: ...


def _bar(f: Taken, index: int) -> Bar:
    for bar in f.info.bars:
        if bar.index == index:
            return bar
    raise Misuse(f"{f.bus} has no BAR {index}")


def bus(f: Taken, bar: int, offset: int, length: int) -> Bus:
    """The bus ranges at which another device reaches ``length`` bytes at ``offset`` of BAR
    ``bar`` of ``f``, or why it cannot (``Bus.reason``): the function must be taken
    physically on this machine (behind an IOMMU another device reaches a BAR only through a
    mapping of its own IOMMU domain, which rig does not make), and the BAR must have a bus
    address. Raises :class:`rig_edge.Misuse` for a BAR the function lacks or a range outside
    it, or a released function."""
    if f.closed:
        raise Misuse(f"bus: {f.bus} was released")
    b = _bar(f, bar)
    if offset < 0 or length <= 0 or offset + length > b.size:
        raise Misuse(f"{f.bus} BAR {bar}: 0x{length:x} bytes at 0x{offset:x} are outside it")
    if not f.machine.is_this:
        return Bus(reason=f"{f.bus} lies on {f.machine.name}, not this machine")
    if f.how != "physically":
        return Bus(
            reason=f"{f.bus} is taken through {f.how}: behind an IOMMU, another device reaches "
            "its BAR only through a mapping in that device's own IOMMU domain"
        )
    if b.address == 0:
        return Bus(reason=f"{f.bus} BAR {bar} has no bus address")
    return Bus(ranges=((b.address + offset, length),))


DMA_PAGE = 4096  # the smallest page DMA memory comes in: its bus addresses run on within one


def dma_bus(f: Taken, memory: Dma, offset: int, length: int) -> Bus:
    """The bus ranges at which another device reaches ``length`` bytes at ``offset`` of DMA
    memory ``memory`` that ``f`` was given (:meth:`rig_pci.Function.alloc_dma`,
    :meth:`~rig_pci.Function.map_host`), in order, adjacent runs joined; or why it cannot
    (``Bus.reason``), as :func:`bus` answers for a BAR: the function must be taken physically
    on this machine, where the memory's bus addresses are its physical addresses, which any
    device reaches. Behind an IOMMU they are I/O virtual addresses of ``f``'s own IOMMU
    domain (its VFIO container's mappings, drivers/vfio/vfio_iommu_type1.c), which another
    device's requests are not translated through; reaching the memory from there takes a
    mapping in that device's own domain, which rig does not make. Raises
    :class:`rig_edge.Misuse` for a range outside the memory, or a released function."""
    if f.closed:
        raise Misuse(f"dma_bus: {f.bus} was released")
    if offset < 0 or length <= 0 or offset + length > memory.length:
        raise Misuse(f"dma_bus: 0x{length:x} bytes at 0x{offset:x} are outside the "
                     f"0x{memory.length:x} bytes of DMA memory")
    if not f.machine.is_this:
        return Bus(reason=f"{f.bus} lies on {f.machine.name}, not this machine")
    if f.how != "physically":
        return Bus(
            reason=f"{f.bus} is taken through {f.how}: behind an IOMMU, its DMA memory's bus "
            "addresses are I/O virtual addresses of its own IOMMU domain, which another "
            "device reaches only through a mapping in that device's own domain"
        )
    runs: list[tuple[int, int]] = []
    at, end = offset, offset + length
    while at < end:  # page by page: memory.bus_address is all a DmaMemory promises
        n = min(DMA_PAGE - at % DMA_PAGE, end - at)
        address = memory.bus_address(at)
        if runs and runs[-1][0] + runs[-1][1] == address:
            runs[-1] = (runs[-1][0], runs[-1][1] + n)
        else:
            runs.append((address, n))
        at += n
    return Bus(ranges=tuple(runs))


def _path(t: SysfsTransport, address: str) -> list[str]:
    """The function's bus addresses from its root port down to itself, from the path of its
    sysfs directory (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...)."""
    out = []
    for part in Path(os.path.realpath(t.function_path(address))).parts:
        try:
            parse_address(part)
        except ValueError:
            continue
        out.append(part)
    return out


def _acs_redirects(t: SysfsTransport, address: str) -> bool | None:
    """Whether the bridge at ``address`` redirects peer requests upstream (ACS control has
    RR, CR or EC set); ``None`` when its extended config space cannot be read (non-root
    readers see 64 bytes of it)."""
    try:
        cfg = (t.function_path(address) / "config").read_bytes()
    except OSError:
        return None
    if len(cfg) <= PCI_CFG_SPACE_SIZE:
        return None if len(cfg) < PCI_CFG_SPACE_SIZE else False  # conventional: no ACS
    at, seen = PCI_CFG_SPACE_SIZE, 0
    while at and at + 8 <= len(cfg) and seen < 256:  # PCIe r6.0 7.6: a list of headers
        header = int.from_bytes(cfg[at : at + 4], "little")
        if header in (0, 0xFFFF_FFFF):
            return False
        if header & 0xFFFF == PCI_EXT_CAP_ID_ACS:
            control = int.from_bytes(cfg[at + PCI_ACS_CTRL : at + PCI_ACS_CTRL + 2], "little")
            return bool(control & ACS_REDIRECTS)
        at, seen = (header >> 20) & 0xFFC, seen + 1
    return False


def why_apart(a: Function, b: Function, *, bar: int, memory: tuple[int, int]) -> str | None:
    """Why ``a`` and ``b`` cannot map each other's memory (see :func:`reaches`), or ``None``
    when they can."""
    if a.closed or b.closed:
        raise Misuse("reaches: a function was released")
    for f in (a, b):
        if f.how != "physically":
            return f"{f.bus} is taken through {f.how}, not physically"
    if a.machine.name != b.machine.name or not isinstance(a.machine.transport, SysfsTransport):
        return "they do not lie on one machine reached through its sysfs"
    for f, need in zip((a, b), memory, strict=True):
        size = _bar(f, bar).size
        if size < need:
            return f"{f.bus} BAR {bar} shows 0x{size:x} bytes of its 0x{need:x}"
    t = a.machine.transport
    pa, pb = _path(t, a.bus), _path(t, b.bus)
    common = 0
    while common < min(len(pa), len(pb)) - 1 and pa[common] == pb[common]:
        common += 1
    if common == 0:
        return f"{a.bus} and {b.bus} meet only in the root complex"
    # The bridges the requests cross: below the meeting point on each side, and the switch
    # port they meet in (p2pdma.c checks the same ones).
    for bridge in [*pa[common - 1 : -1], *pb[common:-1]]:
        redirects = _acs_redirects(t, bridge)
        if redirects is None:
            return f"the ACS control of bridge {bridge} cannot be read (run as root)"
        if redirects:
            return f"bridge {bridge} redirects peer requests to the root complex (ACS)"
    return None


def reaches(a: Function, b: Function, *, bar: int, memory: tuple[int, int]) -> bool:
    """Whether ``a`` and ``b`` can map each other's memory through BAR ``bar`` of each: both
    are taken physically, on one machine, BAR ``bar`` of ``a`` shows at least ``memory[0]``
    bytes and of ``b`` at least ``memory[1]`` (all of each device's memory), and the bus
    carries requests between them (they meet in a switch whose ports on the way do not
    redirect peer requests). Reads config space, changes nothing. Raises
    :class:`rig_edge.Misuse` for a BAR a function lacks or a released function."""
    return why_apart(a, b, bar=bar, memory=memory) is None
