"""The RM interface the PCI path speaks (:class:`rig_nv.rm.RM`): GSP_RM_ALLOC /
GSP_RM_CONTROL / FREE over :class:`rig_nv_pci.gsp.rpc.RpcRM`, as CPU-RM sends them for a GSP
client in open-gpu-kernel-modules 570.144.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-rm.md."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rig_edge import RigError
from rig_nv.hostmem import view
from rig_nv.rm import RM, RMError
from rig_nv_pci.gsp import rpc
from rig_nv_pci.gsp.events import EventLog
from rig_nv_pci.gsp.queue import QueueError
from rig_nv_pci.path import channels
from rig_nv_pci.path.channels import GPFIFO_CLASSES, KEPLER_CHANNEL_GROUP_A, ChannelMemory
from rig_nv_pci.path.grctx import COMPUTE_CLASSES, GrContexts
from rig_nv_pci.path.runlists import Doorbells

# Controls with a pointer and their _V2 twins (570.144 ctrl headers).
NV0080_CTRL_CMD_GPU_GET_CLASSLIST = 0x800201
NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2 = 0x800292
NV0080_CTRL_GPU_CLASSLIST_MAX_SIZE = 100
NV2080_CTRL_CMD_GR_GET_INFO = 0x20801201
NV2080_CTRL_CMD_GR_GET_INFO_V2 = 0x20801228
NV0080_CTRL_GR_INFO_MAX_SIZE = 0x3A
NV2080_CTRL_CMD_FB_GET_INFO = 0x20801301
NV2080_CTRL_CMD_FB_GET_INFO_V2 = 0x20801303
NV2080_CTRL_FB_INFO_MAX_LIST_SIZE = 0x39
# NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS {NvU32 numClasses; NvU32 classList[100]}: 404 bytes.
CLASSLIST_V2 = struct.Struct(f"<I{NV0080_CTRL_GPU_CLASSLIST_MAX_SIZE}I")
# NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS {NvU32 numClasses; NvP64 classList}: 16 bytes.
CLASSLIST = struct.Struct("<I4xQ")
# NV2080_CTRL_GR_GET_INFO_PARAMS {NvU32 grInfoListSize; NvP64 grInfoList;
# NV2080_CTRL_GR_ROUTE_INFO grRouteInfo {NvU32 flags; NvU64 route}}: 32 bytes.
GR_INFO = struct.Struct("<I4xQI4xQ")
# NV2080_CTRL_GR_GET_INFO_V2_PARAMS: grInfoListSize, 0x3a {index, data}, then grRouteInfo
# aligned to 8: 488 bytes.
GR_INFO_V2 = struct.Struct(f"<I{2 * NV0080_CTRL_GR_INFO_MAX_SIZE}I4xI4xQ")
# NV2080_CTRL_FB_GET_INFO_PARAMS {NvU32 fbInfoListSize; NvP64 fbInfoList}: 16 bytes.
FB_INFO = struct.Struct("<I4xQ")
# NV2080_CTRL_FB_GET_INFO_V2_PARAMS {NvU32 fbInfoListSize; {index, data}[0x39]}: 460 bytes.
FB_INFO_V2 = struct.Struct(f"<I{2 * NV2080_CTRL_FB_INFO_MAX_LIST_SIZE}I")
# clc36f.h: NVC36F_CTRL_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS {NvU32 workSubmitToken}, which
# CPU-RM answers itself (rig_nv_pci.path.runlists)
NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xC36F0108


@dataclass(frozen=True)
class GspClient:
    """The booted GSP as its path speaks to it: the root client's RPC RM, ``poll`` handing on
    its pending events (``None``: nothing drains them), and the log its boot's events go to
    (``events``: the faults the device raises, and text for messages)."""

    rm: rpc.RpcRM
    poll: Callable[[], Any] | None = None
    events: EventLog | None = None


class PciRM:
    """The RM interface over RPCs, with the pointer-carrying list controls sent as their _V2
    twins (see the module's docstring)."""

    def __init__(self, rm: rpc.RpcRM, events: EventLog | None = None) -> None:
        self.rpc_rm = rm
        # the GSP's events (the path's boot's log): whether the GPU faulted during an RPC
        self.events = events
        # the memory a GSP client's channel alloc hands GSP-RM (rig_nv_pci.path.channels)
        self.channels: ChannelMemory | None = None
        # the compute engine's context buffers promoted to GSP-RM (rig_nv_pci.path.grctx)
        self.grctx: GrContexts | None = None
        # the channels' work-submit tokens, as CPU-RM builds them (rig_nv_pci.path.runlists)
        self.doorbells: Doorbells | None = None
        # what gives back memory an ALLOC_MEMORY may have handed GSP-RM though it failed (no
        # plain refusal: the module's docstring), each run once GSP-RM answers the free of a
        # root (channels.roots: the device, the client), under which that object would be
        self.kept: list[Callable[[], None]] = []

    @property
    def client(self) -> int:
        return self.rpc_rm.client

    @property
    def release(self) -> str:
        return self.rpc_rm.release

    @property
    def layouts(self) -> str:
        return self.rpc_rm.layouts

    def new_handle(self) -> int:
        return self.rpc_rm.new_handle()

    def mark(self) -> int:
        """The event log's count of faults, before an RPC (for :meth:`refused`)."""
        return self.events.faults if self.events is not None else 0

    def refused(self, e: BaseException, mark: int) -> bool:
        """Whether ``e``, ending an RPC begun when the event log's count of faults read
        ``mark``, is GSP-RM's refusal with the GPU not faulted meanwhile (the module's
        docstring): then the memory the path gave for the object goes back at once."""
        return isinstance(e, rpc.Refused) and (self.events is None
                                               or not self.events.faulted_since(mark))

    def alloc(self, parent: int, handle: int, cls: int, params: bytearray | None = None) -> int:
        self.rpc_rm.rpc.answering(rpc.Function.GSP_RM_ALLOC)  # before any memory is taken for it
        mark = self.mark()
        if (cls in COMPUTE_CLASSES and self.grctx is not None and self.channels is not None
                and parent in self.channels.channels):
            try:
                self.grctx.promote(parent, self.channels.channels[parent].group,
                                   lambda e: self.refused(e, mark))
            except MemoryError as e:
                raise RMError(f"{self.rpc_rm.rpc.name}: {e}", channels.NV_ERR_NO_MEMORY) from e
        if self.channels is not None and cls == KEPLER_CHANNEL_GROUP_A and params is not None:
            made = self.rpc_rm.alloc(parent, handle, cls, params)
            self.channels.grouped(handle, params)
            return made
        if self.channels is None or cls not in GPFIFO_CLASSES or params is None:
            return self.rpc_rm.alloc(parent, handle, cls, params)
        sent = self.channels.params(parent, handle, params)
        try:
            return self.rpc_rm.alloc(parent, handle, cls, sent)
        except BaseException as e:
            # GSP-RM's plain refusal gives the channel's memory back; anything else keeps it
            # as a channel GSP-RM may hold (freed with its group or the device)
            if self.refused(e, mark):
                self.channels.refused(handle)
            raise

    def free(self, obj: int) -> None:
        self.rpc_rm.free(obj)
        if self.channels is not None:
            self.channels.freed(obj)
            if self.grctx is not None:
                self.grctx.freed(obj, obj in self.channels.roots)
            if obj in self.channels.roots:
                while self.kept:
                    self.kept.pop(0)()

    def free_at_stop(self, obj: int) -> None:
        """:meth:`free` of the device's own object at the device's stop
        (:meth:`rig_nv_pci.path.pci.PciPath.closed`), where a GSP that stopped answering
        (:class:`rig_nv_pci.gsp.rpc.RpcTimeout`, :class:`rig_nv_pci.gsp.rpc.NotAnswering`,
        :class:`rig_nv_pci.gsp.queue.QueueError`) is no error: the stop goes on, keeping what
        GSP-RM may still hold (everything under the device, :attr:`kept` too), and the GSP's
        stop that follows, unable to free the client, reports the GPU lost to the opener,
        which resets it at its next open (:mod:`rig_nv_pci.held`). GSP-RM's refusal still
        raises."""
        with contextlib.suppress(rpc.RpcTimeout, QueueError):
            self.free(obj)

    def control(self, obj: int, cmd: int, params: bytearray | None) -> None:
        if (cmd == NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN and params is not None
                and self.doorbells is not None and self.channels is not None
                and obj in self.channels.channels):
            # CPU-RM's own answer (kchannelCtrlCmdGpfifoGetWorkSubmitToken_IMPL): no RPC
            held = self.channels.channels[obj]
            struct.pack_into("<I", params, 0, self.doorbells.token(held.runlist, held.chid))
            return
        if params is None or cmd not in (NV0080_CTRL_CMD_GPU_GET_CLASSLIST,
                                         NV2080_CTRL_CMD_GR_GET_INFO,
                                         NV2080_CTRL_CMD_FB_GET_INFO):
            self.rpc_rm.control(obj, cmd, params)
            return
        if cmd == NV0080_CTRL_CMD_GPU_GET_CLASSLIST:
            _, pointer = CLASSLIST.unpack_from(params)
            v2 = bytearray(CLASSLIST_V2.size)
            self.rpc_rm.control(obj, NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2, v2)
            n, *listed = CLASSLIST_V2.unpack(v2)
            n = min(n, NV0080_CTRL_GPU_CLASSLIST_MAX_SIZE)
            if pointer:
                view(pointer, 4 * n)[:] = struct.pack(f"<{n}I", *listed[:n])
            CLASSLIST.pack_into(params, 0, n, pointer)
            return
        if cmd == NV2080_CTRL_CMD_GR_GET_INFO:
            size, pointer, flags, route = GR_INFO.unpack_from(params)
            limit, twin, fmt = (NV0080_CTRL_GR_INFO_MAX_SIZE, NV2080_CTRL_CMD_GR_GET_INFO_V2,
                                GR_INFO_V2)
        else:
            size, pointer = FB_INFO.unpack_from(params)
            limit, twin, fmt = (NV2080_CTRL_FB_INFO_MAX_LIST_SIZE, NV2080_CTRL_CMD_FB_GET_INFO_V2,
                                FB_INFO_V2)
        if size > limit:
            raise RigError(f"RM control 0x{cmd:x}: {size} entries, more than its _V2 twin's "
                           f"{limit}")
        entries = view(pointer, 8 * size)
        pairs = list(struct.unpack(f"<{2 * size}I", entries)) + [0] * 2 * (limit - size)
        tail = (flags, route) if cmd == NV2080_CTRL_CMD_GR_GET_INFO else ()
        v2 = bytearray(fmt.pack(size, *pairs, *tail))
        self.rpc_rm.control(obj, twin, v2)
        entries[:] = v2[4:4 + 8 * size]


def _speaks_rm(rm: PciRM) -> RM:  # mypy proves PciRM implements rig_nv.rm.RM
    return rm
