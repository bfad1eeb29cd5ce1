"""Peer mappings of the PCI path (:meth:`rig_nv_pci.path.pci.PciPath.map_peer` and
``unmap_peer``, so ``d1.map_peer(d0, region)`` between two GPUs opened over PCI): another
GPU's region mapped at its own GPU address into this GPU's tables as NVIDIA's RM maps BAR1
P2P (open-gpu-kernel-modules 570.144: virtual_mem.c virtmemMapTo_IMPL,
mem_mgr/arch/hopper/virt_mem_allocator_gh100.c dmaAllocBar1P2PMapping_GH100,
virt_mem_allocator_gm107.c dmaAllocMapping_GM107, dmaUpdateVASpace_GF100), only where
:func:`rig_pci.memory.why_apart` finds the two GPUs reach each other (the spec's rule): the
owner's video memory through its BAR 1, by bus address, as non-coherent volatile system
memory; Pinned memory at the machine's bus addresses the owner maps.

Functions take the mapper's path and the owner's as :class:`Peer`s; PciPath is one, and its
Path methods call them (refusing an owner not opened over PCI itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from rig_edge import Memory, RigError
from rig_nv.rm import Allocation
from rig_nv_pci.path import vidmem
from rig_nv_pci.path.allocations import Bar1, Undo
from rig_nv_pci.path.space import AddressSpace
from rig_pci import Function
from rig_pci import memory as pci_memory


class Peer(Protocol):
    """A GPU's path as a peer mapping takes it, the mapper's or the owner's
    (:class:`rig_nv_pci.path.pci.PciPath` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def function(self) -> Function | None:
        """The GPU's PCI function (``None``: the path maps no peer's memory)."""
        ...

    @property
    def fb_size(self) -> int:
        """The bytes of the GPU's memory."""
        ...

    @property
    def space(self) -> AddressSpace:
        """The GPU's address space (its GPU addresses from one range for every GPU a process
        opens over PCI)."""
        ...

    @property
    def bar1(self) -> Bar1:
        """The GPU's BAR 1 as its path maps video memory into it."""
        ...


def apart(path: Peer, owner: Peer) -> str | None:
    """Why ``path``'s GPU and ``owner``'s cannot map each other's memory (the spec: both taken
    physically, on one machine, each BAR 1 reaching all of its GPU's memory, and the bus
    carrying requests between them: :func:`rig_pci.memory.why_apart`), or ``None``."""
    for p in (path, owner):
        if p.function is None or not p.fb_size:
            return (f"{p.name}'s path was not given its PCI function and memory size, "
                    "so whether the GPUs reach each other cannot be asked")
    assert path.function is not None and owner.function is not None
    return pci_memory.why_apart(path.function, owner.function, bar=1,
                                memory=(path.fb_size, owner.fb_size))


def map_peer(path: Peer, a: Allocation, owner: Peer) -> Allocation:
    """Map ``a``, memory of the GPU of ``owner`` (another GPU opened over PCI), into ``path``'s
    GPU's address space at ``a.gpu``, the address it has on its own GPU: every GPU the
    process opens over PCI takes its addresses from one range, so no region of this GPU
    lies there (:mod:`rig_nv_pci.path.addresses`).

    As NVIDIA's RM maps a peer's memory over PCIe with BAR1 P2P (open-gpu-kernel-modules
    570.144: virtual_mem.c virtmemMapTo_IMPL, whose bBar1P2P case calls
    mem_mgr/arch/hopper/virt_mem_allocator_gh100.c dmaAllocBar1P2PMapping_GH100): the
    memory is mapped into the owner's BAR 1 (kbusMapFbApertureSingle on the owner), and
    this GPU's PTEs name it as system memory (ADDR_SYSMEM) at the owner's BAR 1 bus
    address, NV_MMU_PTE_KIND_GENERIC_MEMORY, with NVOS46_FLAGS_CACHE_SNOOP_DISABLE, so
    that virt_mem_allocator_gm107.c dmaAllocMapping_GM107 picks
    NV_MMU_PTE_APERTURE_SYSTEM_NON_COHERENT_MEMORY; its memdesc keeps memdescCreate's GPU
    cache attribute NV_MEMORY_UNCACHED, which makes dmaUpdateVASpace_GF100 write the PTE
    volatile. So here: Mapped memory is reached at the BAR 1 offset the owner mapped it
    at; Device memory is mapped into the owner's BAR 1 by the owner's BAR 1 tables for
    this mapping (given back by :func:`unmap_peer`), or refused where BAR 1 has no room;
    the bus address is :func:`rig_pci.memory.bus`'s, and this GPU's PTEs are
    SYSTEM_NON_COHERENT_MEMORY, volatile, kind GENERIC, in the owner's memory's page size
    (as the GH100 code copies the page size from the peer's memory). Pinned memory is the
    machine's system memory: it is mapped at the bus addresses the owner maps it at,
    coherent, as the owner maps it (both GPUs are taken physically, so no IOMMU stands
    between either GPU and it).

    NVIDIA's RM uses BAR1 P2P only on GH100 and the GB10x/GB20x chips (g_kern_bus_nvoc.c
    kbusCreateP2PMappingForBar1P2P's HAL, kern_bus_gh100.c
    kbusIsPcieBar1P2PMappingSupported_GH100: both GPUs' BAR 1 statically mapping all of
    their memory); Ampere and Ada get its mailbox P2P, with the PEER aperture
    (kern_bus_gp100.c kbusCreateP2PMapping_GP100, their HAL, has no PCIE_BAR1 case). That the
    Ampere and Ada chips this path opens also carry BAR1 P2P with a BAR 1 that reaches all
    of their memory is what tinygrad's patched driver reports (tinygrad/
    open-gpu-kernel-modules, issue 28, quoting its README), not what NVIDIA documents.

    Refused with :class:`rig_edge.RigError` naming the reason where the GPUs cannot map
    each other's memory (:func:`apart`, the spec's rule, for every kind), their addresses
    are not one range, this path does not write its page tables, or BAR 1 or video memory
    (for a page table) has no room; what it made is given back first."""
    why = apart(path, owner)
    if why is not None:
        raise RigError(f"{path.name}: {owner.name}'s memory cannot be mapped here: {why}")
    if path.space.tables is None:
        raise RigError(f"{path.name}: the path does not write its page tables, so it maps "
                       "no peer's memory")
    if path.space.addresses is not owner.space.addresses:
        raise RigError(f"{path.name}: {owner.name} takes its GPU addresses from another "
                       f"range, so 0x{a.gpu:x} may be this GPU's own")
    undo: Undo = a.undo
    mine = Undo(None, a.gpu, undo.size, huge=undo.huge)
    try:
        if a.kind is Memory.PINNED:
            if undo.dma is None:
                raise RigError(f"{path.name}: {owner.name}'s region at 0x{a.gpu:x} has no "
                               "system memory")
            path.space.map(0, undo.size, a.gpu, undo.huge, undo.dma.bus_address, False)
            return Allocation(a.gpu, a.host, a.length, a.kind, a.handle, mine)
        start = peer_bar1_bus(path, a, owner, mine)
        path.space.map(0, undo.size, a.gpu, undo.huge, lambda o: start + o, False,
                  kind=vidmem.KIND_GENERIC, coherent=False, volatile=True)
    except BaseException:
        with contextlib.suppress(RigError):  # what was made, given back; the first
            unmap_peer(path, mine)            # failure is the one to tell
        raise
    return Allocation(a.gpu, a.host, a.length, a.kind, a.handle, mine)


def peer_bar1_bus(path: Peer, a: Allocation, owner: Peer, mine: Undo) -> int:
    """The bus address at which ``owner``'s video memory ``a`` lies in its BAR 1, mapped
    there for this mapping if it is not (Device memory; noted in ``mine.lent``)."""
    undo: Undo = a.undo
    if undo.fb is None:
        raise RigError(f"{path.name}: {owner.name}'s region at 0x{a.gpu:x} has no video "
                       "memory")
    if undo.bar1 is not None:  # Mapped memory, at its BAR 1 offset
        at = undo.bar1
    elif owner.bar1.tables is None:  # BAR 1 shows video memory one to one
        at = undo.fb
    else:
        lent = Undo(None, None, undo.size, huge=undo.huge)
        try:
            got = owner.bar1.map(undo.fb, undo.size, undo.huge, lent)
        finally:  # a range taken (and maybe part mapped) is the mapping's to give back
            if lent.bar1 is not None:
                mine.lent = (owner.bar1, lent.bar1)
        if got is None:
            raise RigError(f"{path.name}: {owner.name}'s BAR 1 has no room for the 0x"
                           f"{undo.size:x} bytes at 0x{a.gpu:x}")
        at = got
    assert owner.function is not None
    bus = pci_memory.bus(owner.function, 1, at, undo.size)
    if bus.reason is not None or len(bus.ranges) != 1:
        raise RigError(f"{path.name}: {owner.name}'s BAR 1 at 0x{at:x} cannot be reached: "
                       f"{bus.reason or 'not one run of bus addresses'}")
    start, _ = bus.ranges[0]
    return start


def unmap_peer(path: Peer, undo: Undo) -> None:
    """End the mapping whose ``undo`` :func:`map_peer` made: ``path``'s PTEs cleared (and its
    TLB invalidated), then the owner's BAR 1 range lent for it given back, as
    dmaFreeBar1P2PMapping_GH100 unmaps it after the mapping; a step that fails is retried by
    the next call, none repeated."""
    def step(name: str, fn: Callable[[], object]) -> None:
        if name not in undo.done:
            fn()
            undo.done.add(name)

    va = undo.va
    assert va is not None
    step("unmap", lambda: path.space.unmap(0, va, undo.size, undo.huge))
    if undo.lent is not None:
        bar1, at = undo.lent
        step("lent", lambda: bar1.unmap(at, undo.size, undo.huge))
