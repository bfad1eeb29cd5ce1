"""A channel's memory as a GSP client's CPU-RM hands it to GSP-RM.

NVIDIA's CPU-RM (open-gpu-kernel-modules 570.144 / 570.211.01) allocates a GSP client's
channel memory itself and names it in the channel's alloc (kernel_channel.c
_kchannelSendChannelAllocRpc, its IS_GSP_CLIENT branch of NV_CHANNEL_ALLOC_PARAMS,
alloc_channel.h).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-channels.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rig_nv import classes
from rig_nv.rm import RMError
from rig_nv_pci.boot.gspmem import in_one_run

# NV_ADDRESS_SPACE (g_mem_desc_nvoc.h) and the CPU cache attributes (nv_memory_type.h)
ADDR_SYSMEM, ADDR_FBMEM = 1, 2
NV_MEMORY_CACHED, NV_MEMORY_UNCACHED = 0, 1
INSTANCE_SIZE = 4096  # NV_RAMIN_ALLOC_SIZE (ga100/dev_ram.h), aligned to 1 << 12
RAMFC_SIZE = 128 * 32 // 8  # DRF_SIZE(NV_RAMIN_RAMFC) / 8 (gm107/dev_ram.h)
USERD_SIZE = 512  # NV_RAMUSERD_CHAN_SIZE (gm107/dev_ram.h)
NV2080_CTRL_CMD_CE_GET_FAULT_METHOD_BUFFER_SIZE = 0x20802A08  # ctrl2080ce.h: {NvU32 size}
NV_ERR_NO_MEMORY, NV_ERR_INVALID_ARGUMENT = 0x51, 0x1F
GPFIFO_CLASSES = frozenset(classes.GPFIFO)
KEPLER_CHANNEL_GROUP_A = classes.KEPLER_CHANNEL_GROUP_A
# alloc_channel.h: NVOS04_FLAGS_CHANNEL_USERD_INDEX_VALUE 10:8, _USERD_INDEX_FIXED 11:11,
# _USERD_INDEX_PAGE_VALUE 20:12, _USERD_INDEX_PAGE_FIXED 21:21 (TRUE 1)
USERD_INDEX_SHIFT, USERD_INDEX_FIXED = 8, 1 << 11
USERD_PAGE_SHIFT, USERD_PAGE_FIXED = 12, 1 << 21
CHANNELS_PER_USERD_PAGE = 1 << 3  # NVBIT(DRF_SIZE(NVOS04_FLAGS_CHANNEL_USERD_INDEX_VALUE))
CHID_FLAGS = (7 << USERD_INDEX_SHIFT | USERD_INDEX_FIXED | 0x1FF << USERD_PAGE_SHIFT
              | USERD_PAGE_FIXED)
CHIDS = CHANNELS_PER_USERD_PAGE << 9  # what the flags can name
GSP_RESERVED_CHANNELS = 1  # kernel_fifo.c KFIFO_NUM_GSP_RESERVED_CHANNELS


def chid_flags(flags: int, chid: int) -> int:
    """``flags`` naming ``chid`` as CPU-RM does for a GSP client."""
    return (flags & ~CHID_FLAGS | USERD_PAGE_FIXED
            | chid % CHANNELS_PER_USERD_PAGE << USERD_INDEX_SHIFT
            | chid // CHANNELS_PER_USERD_PAGE << USERD_PAGE_SHIFT)


class Dma(Protocol):
    """System memory the GPU reaches (rig_pci.DmaMemory)."""

    @property
    def length(self) -> int: ...

    def bus_address(self, offset: int) -> int: ...

    def free(self) -> None: ...


@dataclass(frozen=True)
class Placed:
    """Where a memory object of the path lies: its address space, the GPU's address of its
    byte at an offset (FB offset or bus address), its size and CPU cache attribute."""

    space: int
    address: Callable[[int], int]
    size: int
    cache: int


@dataclass
class Held:
    group: int
    instance: int  # FB offset
    runlist: int = 0  # the NV2080 engine type whose runlist it is on
    chid: int = 0
    made_buffer: bool = False  # its group's method buffer was made for it (its first channel)
    runlist_id: int = 0  # that runlist, as GSP-RM's device info table numbers it


class ChannelMemory:
    """The memory of the path's channels. ``take_fb(size, align)`` / ``give_fb(at, size)`` the
    path's heap, ``zero_fb(at, size)`` zeroes video memory (``None``: it cannot), ``alloc_dma``
    system memory, ``placed(handle)`` where a memory object of the path lies,
    ``method_buffer_size()`` asks GSP-RM the method buffer's size, ``runlist_of(engine)`` the
    runlist of an NV2080 engine type (:meth:`rig_nv_pci.path.runlists.Doorbells.runlist`)."""

    def __init__(self, name: str, ffi: Any, *, take_fb: Callable[[int, int], int | None],
                 give_fb: Callable[[int, int], None],
                 zero_fb: Callable[[int, int], None] | None,
                 alloc_dma: Callable[[int], Dma | None],
                 placed: Callable[[int], Placed | None],
                 method_buffer_size: Callable[[], int],
                 runlist_of: Callable[[int], int] = lambda engine: 0) -> None:
        self.name, self.ffi = name, ffi
        self._take_fb, self._give_fb, self._zero_fb = take_fb, give_fb, zero_fb
        self._alloc_dma, self._placed = alloc_dma, placed
        self._method_buffer_size = method_buffer_size
        self._runlist_of = runlist_of
        self._size: int | None = None
        self.channels: dict[int, Held] = {}
        self.method_buffers: dict[int, Dma] = {}  # channel group -> its runqueue 0's
        self.roots: set[int] = set()  # handles whose free frees every channel (device, client)
        self.groups: dict[int, int] = {}  # channel group -> its engineType (its runlist)

    def grouped(self, group: int, params: bytes | bytearray) -> None:
        """GSP-RM made channel group ``group`` from NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS
        ``params``: its channels go on its engine's runlist."""
        p = self.ffi.from_buffer("NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS *", params)
        self.groups[group] = int(p.engineType)

    def _chid(self, runlist: int) -> int:
        """The runlist's lowest free ChID (kfifoChidMgrAllocChid_IMPL, GROW_UP)."""
        taken = {h.chid for h in self.channels.values() if h.runlist_id == runlist}
        for chid in range(GSP_RESERVED_CHANNELS, CHIDS):
            if chid not in taken:
                return chid
        raise RMError(f"{self.name}: no free ChID on runlist {runlist}", NV_ERR_NO_MEMORY)

    def params(self, group: int, handle: int, params: bytearray) -> bytearray:
        """The NV_CHANNEL_ALLOC_PARAMS to send for channel ``handle`` of ``group``, made from
        the caller's ``params`` with the memory above; raises :class:`RMError` (having given
        back what it took) where there is no room or a named object is not the path's."""
        sent = bytearray(params)
        p = self.ffi.from_buffer("NV_CHANNEL_ALLOC_PARAMS *", sent)
        runlist = self.groups.get(group, int(p.engineType))
        runlist_id = self._runlist_of(runlist)
        chid = self._chid(runlist_id)
        userd = self._where(p.hUserdMemory[0], "USERD")
        made = group not in self.method_buffers
        mthd = self._method_buffer(group)
        at = self._take_fb(INSTANCE_SIZE, INSTANCE_SIZE)
        if at is None:
            if made:  # made for a channel the path refuses: GSP-RM never saw it
                self.method_buffers.pop(group).free()
            raise RMError(f"{self.name}: no video memory for a channel's instance block",
                          NV_ERR_NO_MEMORY)
        try:
            if self._zero_fb is not None:
                self._zero_fb(at, INSTANCE_SIZE)
            p.hObjectBuffer = 0
            p.ProcessID = os.getpid()
            p.flags = chid_flags(int(p.flags), chid)
            _describe(p.instanceMem, at, INSTANCE_SIZE, ADDR_FBMEM, NV_MEMORY_UNCACHED)
            _describe(p.ramfcMem, at, RAMFC_SIZE, ADDR_FBMEM, NV_MEMORY_UNCACHED)
            offset = int(p.userdOffset[0])
            if offset % USERD_SIZE or offset + USERD_SIZE > userd.size:
                raise RMError(f"{self.name}: USERD at offset 0x{offset:x} of 0x{userd.size:x} "
                              "bytes", NV_ERR_INVALID_ARGUMENT)
            _describe(p.userdMem, userd.address(offset), USERD_SIZE, userd.space, userd.cache)
            assert self._size is not None
            _describe(p.mthdbufMem, mthd.bus_address(0), self._size, ADDR_SYSMEM,
                      NV_MEMORY_CACHED)
            for handle_of, desc in ((p.hObjectError, p.errorNotifierMem),
                                    (p.hObjectEccError, p.eccErrorNotifierMem)):
                if handle_of:
                    n = self._where(handle_of, "error notifier")
                    _describe(desc, n.address(0), n.size, n.space, n.cache)
        except BaseException:
            self._give_fb(at, INSTANCE_SIZE)
            if made:
                self.method_buffers.pop(group).free()
            raise
        self.channels[handle] = Held(group, at, runlist, chid, made, runlist_id)
        return sent

    def _where(self, handle: int, what: str) -> Placed:
        placed = self._placed(handle)
        if placed is None:
            raise RMError(f"{self.name}: a channel's {what} 0x{handle:x} is not memory of this "
                          "path", NV_ERR_INVALID_ARGUMENT)
        return placed

    def _method_buffer(self, group: int) -> Dma:
        """The group's method buffer (made at its first channel), contiguous system memory."""
        dma = self.method_buffers.get(group)
        if dma is not None:
            return dma
        if self._size is None:
            self._size = self._method_buffer_size()
        size = self._size
        dma = self._alloc_dma(-(-size // 4096) * 4096)
        if dma is None:
            raise RMError(f"{self.name}: no system memory for a channel group's method buffer",
                          NV_ERR_NO_MEMORY)
        if not in_one_run(dma, size):
            dma.free()
            raise RMError(f"{self.name}: a method buffer of 0x{size:x} bytes is not contiguous "
                          "on the bus", NV_ERR_NO_MEMORY)
        self.method_buffers[group] = dma
        return dma

    def failed(self, handle: int) -> None:
        """Channel ``handle`` is gone from GSP-RM: its instance block and ChID go back."""
        held = self.channels.pop(handle, None)
        if held is not None:
            self._give_fb(held.instance, INSTANCE_SIZE)

    def refused(self, handle: int) -> None:
        """GSP-RM refused channel ``handle`` (and holds nothing of it): its instance block and
        ChID go back, and its group's method buffer where it was made for this channel and no
        other channel of the group holds it (one GSP-RM saw with another channel stays the
        group's until the group is freed)."""
        held = self.channels.get(handle)
        self.failed(handle)
        if (held is not None and held.made_buffer and held.group in self.method_buffers
                and all(h.group != held.group for h in self.channels.values())):
            self.method_buffers.pop(held.group).free()

    def freed(self, handle: int) -> None:
        """GSP-RM freed ``handle``: a channel's memory, a group's (its channels' and method
        buffer) or, for a root, all of it goes back."""
        every = handle in self.roots
        for ch in [h for h, held in self.channels.items()
                   if every or handle in (h, held.group)]:
            self.failed(ch)
        for group in [g for g in self.method_buffers if every or g == handle]:
            self.method_buffers.pop(group).free()
        for group in [g for g in self.groups if every or g == handle]:
            del self.groups[group]


def _describe(desc: Any, base: int, size: int, space: int, cache: int) -> None:
    """Fill an NV_MEMORY_DESC_PARAMS (alloc_channel.h)."""
    desc.base, desc.size, desc.addressSpace, desc.cacheAttrib = base, size, space, cache
