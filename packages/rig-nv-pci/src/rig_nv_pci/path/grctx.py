"""The compute engine's context buffers, as a GSP client's CPU-RM gives them to GSP-RM.

NVIDIA's CPU-RM (open-gpu-kernel-modules 570.144 / 570.211.01) allocates a GSP client's
graphics context buffers itself, maps them into the channel's address space and hands them to
GSP-RM with NV2080_CTRL_CMD_GPU_PROMOTE_CTX (ctrl2080gpu.h 0x2080012b) before the first
object of a graphics or compute class is made on a channel (kernel_graphics_object.c
_kgrAlloc: kgrctxAllocCtxBuffers, kgrctxMapCtxBuffers, then kgrobjPromoteContext).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-grctx.md."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from rig_nv import classes

NV2080_CTRL_CMD_GPU_PROMOTE_CTX = 0x2080012B
NV0080_CTRL_CMD_FIFO_GET_ENGINE_CONTEXT_PROPERTIES = 0x801707
# NV2080_CTRL_GPU_PROMOTE_CTX_BUFFER_ID_* (ctrl2080gpu.h)
MAIN, PATCH, FECS_EVENT, PRIV_ACCESS_MAP, UNRESTRICTED_PRIV_ACCESS_MAP = 0, 2, 9, 10, 11
# NV0080_CTRL_FIFO_GET_ENGINE_CONTEXT_PROPERTIES_ENGINE_ID_* (ctrl0080fifo.h) of each
ENGINE_ID = {MAIN: 0x0, PATCH: 0x10, FECS_EVENT: 0x17, PRIV_ACCESS_MAP: 0x18,
             UNRESTRICTED_PRIV_ACCESS_MAP: 0x18}
GROUP_BUFFERS = (MAIN, PATCH)
GLOBAL_BUFFERS = (FECS_EVENT, PRIV_ACCESS_MAP, UNRESTRICTED_PRIV_ACCESS_MAP)
PHYS_ATTR = 0 | 1 << 2  # APERTURE_VIDMEM, GPU_CACHEABLE_NO
NV2080_ENGINE_TYPE_GR0 = 1  # ctrl2080gpu.h / cl2080_notification.h
# NV2080_CTRL_GPU_PROMOTE_CTX_PARAMS: engineType, hClient, ChID, hChanClient, hObject,
# hVirtMemory, virtAddress u64, size u64, entryCount (padded to 8), then
# NV2080_CTRL_GPU_PROMOTE_CONTEXT_MAX_ENTRIES (16) entries of 32 bytes: 560 bytes
PROMOTE = struct.Struct("<6IQQI4x")
ENTRY = struct.Struct("<QQQIHBB")
MAX_ENTRIES = 16
COMPUTE_CLASSES = frozenset(classes.COMPUTE)


@dataclass
class Buffer:
    fb: int
    size: int
    va: int
    initialized: bool = False


@dataclass
class Group:
    buffers: dict[int, Buffer] = field(default_factory=dict)
    promoted: set[int] = field(default_factory=set)


class GrContexts:
    """The path's graphics context buffers. ``control(obj, cmd, params)`` the RM's,
    ``take_fb(size, align)`` / ``give_fb`` the heap, ``map_fb(fb, size)`` maps video memory
    at a GPU address of the path (``None``: no room) and ``unmap(va, size)`` unmaps it."""

    def __init__(self, client: int, h_device: int, h_subdevice: int, *,
                 control: Callable[[int, int, bytearray], None],
                 take_fb: Callable[[int, int], int | None], give_fb: Callable[[int, int], None],
                 map_fb: Callable[[int, int], int | None],
                 unmap: Callable[[int, int], None]) -> None:
        self.client, self.h_device, self.h_subdevice = client, h_device, h_subdevice
        self._control, self._take_fb, self._give_fb = control, take_fb, give_fb
        self._map_fb, self._unmap = map_fb, unmap
        self.groups: dict[int, Group] = {}
        self.globals: dict[int, Buffer] = {}
        self._properties: dict[int, tuple[int, int]] = {}

    def properties(self, engine: int) -> tuple[int, int]:
        """(size, alignment) of an engine's context (NV0080_CTRL_FIFO_GET_ENGINE_CONTEXT_
        PROPERTIES_PARAMS {engineId, alignment, size})."""
        if engine not in self._properties:
            params = bytearray(struct.pack("<III", engine, 0, 0))
            self._control(self.h_device, NV0080_CTRL_CMD_FIFO_GET_ENGINE_CONTEXT_PROPERTIES,
                          params)
            _, align, size = struct.unpack("<III", params)
            self._properties[engine] = (size, align)
        return self._properties[engine]

    def _buffer(self, buffer_id: int) -> Buffer:
        size, align = self.properties(ENGINE_ID[buffer_id])
        size = -(-size // 4096) * 4096
        if not size:
            raise MemoryError(f"GSP-RM reports no size for context buffer {buffer_id}")
        fb = self._take_fb(size, max(align, 4096))
        if fb is None:
            raise MemoryError(f"no video memory for context buffer {buffer_id}")
        va = self._map_fb(fb, size)
        if va is None:
            self._give_fb(fb, size)
            raise MemoryError(f"no GPU addresses for context buffer {buffer_id}")
        return Buffer(fb, size, va)

    def promote(self, channel: int, group: int,
                gives_back: Callable[[BaseException], bool] = lambda e: False) -> None:
        """Before the first compute object on ``channel`` (of ``group``): its group's and the
        GPU's buffers made, mapped and handed over with one NV2080_CTRL_CMD_GPU_PROMOTE_CTX;
        nothing when all of them already were. The buffers this call made go back where it
        fails before the promote is sent (no room: MemoryError), and where the promote fails
        with an exception ``gives_back`` says is GSP-RM's refusal of it; else they stay
        (GSP-RM may hold them)."""
        g = self.groups.setdefault(group, Group())
        made: list[tuple[dict[int, Buffer], int]] = []
        try:
            for buffer_id in GROUP_BUFFERS:
                if buffer_id not in g.buffers:
                    g.buffers[buffer_id] = self._buffer(buffer_id)
                    made.append((g.buffers, buffer_id))
            for buffer_id in GLOBAL_BUFFERS:
                if buffer_id not in self.globals:
                    self.globals[buffer_id] = self._buffer(buffer_id)
                    made.append((self.globals, buffer_id))
        except BaseException:
            self._forget(made)
            raise
        try:
            self._promote(channel, g)
        except BaseException as e:
            if gives_back(e):
                self._forget(made)
            raise

    def _forget(self, made: list[tuple[dict[int, Buffer], int]]) -> None:
        """Buffers GSP-RM never took: unmapped and given back to the heap (a group left with
        none, and never promoted, is forgotten too)."""
        for where, buffer_id in reversed(made):
            self._release(where.pop(buffer_id))
        for group in [h for h, g in self.groups.items() if not g.buffers and not g.promoted]:
            del self.groups[group]

    def _promote(self, channel: int, g: Group) -> None:
        entries = []
        for buffer_id in GROUP_BUFFERS + GLOBAL_BUFFERS:
            b = g.buffers[buffer_id] if buffer_id in g.buffers else self.globals[buffer_id]
            if b.initialized and buffer_id in g.promoted:
                continue
            entries.append((buffer_id, b))
        if not entries:
            return
        # hClient, ChID, hVirtMemory, virtAddress and size stay 0 as kgrobjPromoteContext
        # leaves them: the entries say it all
        params = bytearray(PROMOTE.pack(NV2080_ENGINE_TYPE_GR0, 0, 0, self.client, channel, 0,
                                        0, 0, len(entries)))
        for buffer_id, b in entries:
            va = 0 if buffer_id in g.promoted else b.va
            params += ENTRY.pack(b.fb, va, b.size, PHYS_ATTR, buffer_id, int(not b.initialized),
                                 int(not va))
        params += bytes(ENTRY.size * (MAX_ENTRIES - len(entries)))
        self._control(self.h_subdevice, NV2080_CTRL_CMD_GPU_PROMOTE_CTX, params)
        for buffer_id, b in entries:  # kgrctxMarkCtxBufferInitialized
            b.initialized = True
            g.promoted.add(buffer_id)

    def freed(self, handle: int, every: bool) -> None:
        """GSP-RM freed ``handle``: a group's buffers go back; with ``every`` all of them."""
        for group in [h for h in self.groups if every or h == handle]:
            for b in self.groups.pop(group).buffers.values():
                self._release(b)
        if every:
            for b in self.globals.values():
                self._release(b)
            self.globals.clear()

    def _release(self, b: Buffer) -> None:
        self._unmap(b.va, b.size)
        self._give_fb(b.fb, b.size)
