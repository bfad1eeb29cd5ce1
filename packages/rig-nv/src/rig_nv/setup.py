"""Building a device on an opened GPU: its channel groups, channels, doorbell, timeline word
and launch arena (what :func:`rig_nv.device.make` runs), and the clock boost it asks for.

Two channel groups, as UVM runs its copies (and CUDA, by its copies' bandwidth): the compute
channel in a group on the graphics runlist (NV2080_ENGINE_TYPE_GRAPHICS), which also drives
that runlist's GR copy engine (GRCE) on subchannel 4 for steps; the copy channel in a group of
its own on the runlist of the asynchronous copy engine :mod:`rig_nv.engines` chooses
(NV2080_ENGINE_TYPE_COPY(n)), which has more physical copy engines behind it than the GRCE's
one or two. Where the GPU reports no usable one, the copy channel is made in the graphics
group, on its GRCE. A queue's compute channel joins the device's graphics group with a
subcontext of its own (:data:`QUEUE_GROUP`); its copy channel gets a group of its own.

Everything made is recorded on the device before the next fallible call, so that its
``stop`` gives back exactly what a failed build made.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from rig_edge import Facts, Memory, RigError
from rig_nv import classes as cls
from rig_nv import engines, qmd
from rig_nv.channel import Channel, Ring
from rig_nv.controls import (
    FB_HEAP_SIZE,
    GR_LITTER_NUM_GPCS,
    GR_LITTER_NUM_SM_PER_TPC,
    GR_LITTER_NUM_TPC_PER_GPC,
    GR_MAX_WARPS_PER_SM,
    GR_SHADER_PIPE_SUB_COUNT,
    GR_SM_VERSION,
    NV2080_CTRL_CMD_FB_GET_INFO,
    NV2080_CTRL_CMD_GR_GET_INFO,
    NV2080_CTRL_CMD_PERF_BOOST,
    NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
    NVA06F_CTRL_CMD_GPFIFO_SCHEDULE,
    NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
    PERF_BOOST_CLEAR,
    PERF_BOOST_CUDA,
    PERF_BOOST_INFINITE,
    class_list,
    info_list,
)
from rig_nv.faults import Debuggee
from rig_nv.hostmem import view
from rig_nv.layouts import Params
from rig_nv.push import (
    COMPUTE_SET_SHADER_LOCAL_MEMORY_WINDOW_A,
    COMPUTE_SET_SHADER_SHARED_MEMORY_WINDOW_A,
    SUBC_COMPUTE,
    SUBC_COPY,
    Push,
    hi_lo,
)
from rig_nv.rm import Allocation, RMError

if TYPE_CHECKING:
    from cffi import FFI

    from rig_nv.device import Device
    from rig_nv.rm import Path
    from rig_nv.timeline import Timeline

# Whether make() asks for that boost. Measured on the H200 (docs/results): copies inside the
# GPU 655 -> 1474 GB/s from idle clocks, but launch+wait 21.5 -> 46 us in the benchmark run.
BOOST = True
# The copy engine make() puts the copy channel on: None the one rig_nv.engines.choose picks;
# "grce" none of its own (the copy channel in the graphics group, on its GRCE); an LCE index
# that one (for measuring one against another: the GPU must report it).
COPY_ENGINE: int | str | None = None
# Where a queue's compute channel goes: "device" the device's graphics group, with a
# subcontext of its own, so the GR engine runs both channels' kernels at once (as CUDA's
# streams of one context); "own" a group of its own, which the scheduler time-slices against
# the device's (measured on the H200, docs/queues.md).
QUEUE_GROUP = "device"
# Whether a launch's QMD releases its value (rig_nv.qmd.Release), not the channel after a wait
# for idle, once the device has a queue: that wait holds every channel of the group, so no
# other queue's kernel runs beside it (the H200, docs/queues.md).
RELEASE_BY_QMD = True
# How a launch released by its QMD waits for the launch before it on its channel (grids of one
# channel otherwise overlap): "acquire-stay" the timeline word on the GPU, the group staying on
# while it waits; "acquire" with SWITCH_TSG; "wfi" a wait for idle of the subcontext, which
# holds other queues too. Saxpys of 4.5 us in flight on a queue took 9.3, 10.5 and 8.6 us
# each (the H200, docs/results/submit-variants-2026-12-02.txt).
ORDER = "acquire-stay"
# NV2080_ENGINE_TYPE_GRAPHICS (cl2080_notification.h): the compute group runs on the GR runlist.
ENGINE_GRAPHICS = engines.ENGINE_GRAPHICS
NVB0B5_ALLOCATION_PARAMETERS_VERSION_1 = 1  # clb0b5sw.h: engineType is an NV2080_ENGINE_TYPE
NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC = 1

GPFIFO_ENTRIES = 0x4000  # a power of two (dev_pbdma GP_BASE_HI_LIMIT2 is log2 of it)
CHANNEL_AREA = 0x40000  # per channel: the ring (0x20000 bytes), then USERD (512 bytes)
PUSHBUFFER = 2 << 20
VIDEO = (Memory.DEVICE, Memory.MAPPED)
LAUNCH_ARENA = 4 << 20
# Launch configurations' slots (rig_nv.launch.Slots): some 500 configurations of small banks.
SLOT_POOL = 4 << 20
# Where the GPU reads launches' QMDs and banks, and the channels' commands, from: video
# memory the host writes through BAR 1 (write-combined; nothing reads it back). Measured on
# the H200 (scripts/latency_probe.py, 2026-11-30): a one-block launch's wait after the
# submission took 7.9-8.1 us with both in pinned host memory, 3.8-4.0 us with the arena in
# video memory and 3.1-3.4 us with the pushbuffers too; an empty submission's round trip
# 1.9 -> 1.35 us. The GPU fetches each from host memory over PCIe otherwise.
ARENA_KIND = Memory.MAPPED
PUSHBUFFER_KIND = Memory.MAPPED
# The channels' GPFIFO rings and USERD: video memory through BAR 1 as well, so a fence orders
# their write-combined writes before the doorbell (rig_nv.hostmem.fence).
CHANNEL_KIND = Memory.MAPPED
# The shared and local memory windows: GPU addresses where a kernel sees its block's shared
# memory and its threads' local memory, never backed by allocations. Hopper wants the shared
# window 4 GiB aligned (NVK nvk_cmd_dispatch.c). They take the top 8 GiB below 2^40.
WINDOWS = (1 << 40) - (8 << 30)
LOCAL_WINDOW, SHARED_WINDOW = WINDOWS, WINDOWS + (4 << 30)
# INVALIDATE_SHADER_CACHES_NO_WFI: INSTRUCTION | GLOBAL_DATA | CONSTANT (clcbc0.h).
INVALIDATE_CODE_AND_DATA = 0x1011
# NV_ERR_INVALID_OBJECT, NV_ERR_INVALID_OBJECT_HANDLE, NV_ERR_OBJECT_NOT_FOUND: already freed.
GONE = (0x31, 0x33, 0x57)


class Objects:
    """The RM objects a build made (handles, freed in reverse at the stop), the channels the
    path was told of, the usermode doorbell's mapping, the channel groups, and whether the
    clock boost was asked for: what :meth:`free_all` gives back."""

    def __init__(self, path: Path, ffi: FFI) -> None:
        self.path = path
        self.ffi = ffi
        self.handles: list[int] = []
        self.attached: list[int] = []
        self.doorbell: memoryview | None = None
        self.tsg = 0  # the compute channel's group
        self.copy_tsg: int | None = None  # the copy channel's group, where it has its own
        self.engine: engines.CopyEngine | None = None  # the copy channels' (None: GRCE)
        self.boosted = False

    def new(self) -> int:
        """A new handle, recorded before the object is made (its free is tried at stop)."""
        h = self.path.rm.new_handle()
        self.handles.append(h)
        return h

    def free_all(self) -> tuple[BaseException | None, OSError | None]:
        """Clear the boost, detach the channels, free every object and unmap the doorbell,
        each step tried whatever failed before it: (the first failure of a detach or free
        that stayed, None once the RM freed them all; the unmap's failure). What stays is
        kept, so a second call tries it again (a device's stop after its queue's)."""
        failures: list[BaseException] = []
        if self.boosted:
            # If the RM refuses, it still drops a client's boost when the client goes.
            with contextlib.suppress(RigError):
                boost(self, PERF_BOOST_CLEAR, 0)
            self.boosted = False
        for h in list(self.attached):
            try:
                self.path.detach_channel(h)
            except RigError as e:
                failures.append(e)
            else:
                self.attached.remove(h)
        failed = {h: why for h in reversed(self.handles) if (why := self._free(h)) is not None}
        # Freeing a parent frees its children: a child whose free failed may be gone since.
        stayed = {h: why for h, why in failed.items() if self._free(h) is not None}
        self.handles = [h for h in self.handles if h in stayed]
        failures.extend(stayed.values())
        unmapped: OSError | None = None
        if self.doorbell is not None:
            doorbell, self.doorbell = self.doorbell, None
            try:
                self.path.unmap_object(doorbell)
            except OSError as e:
                unmapped = e
        return failures[0] if failures else None, unmapped

    def _free(self, h: int) -> BaseException | None:
        """Free RM object ``h``: None once it is gone (freed now or already), else why not."""
        try:
            self.path.rm.free(h)
        except RMError as e:
            return None if e.status in GONE else e
        except RigError as e:
            return e
        return None


def build(d: Device) -> None:
    """Make ``d``'s channels, doorbell, timeline and launch arena on the GPU its path opened:
    what :func:`rig_nv.device.make` runs. Everything made is recorded on ``d`` first, for its
    ``stop`` to give back."""
    path, rm, objects = d.path, d.path.rm, d.objects
    d.classes = cls.choose(class_list(path), path.name)
    tpcs, sm_version, warps, sm_per_tpc, gpcs, tpc_per_gpc = info_list(
        path,
        NV2080_CTRL_CMD_GR_GET_INFO,
        [GR_SHADER_PIPE_SUB_COUNT, GR_SM_VERSION, GR_MAX_WARPS_PER_SM,
         GR_LITTER_NUM_SM_PER_TPC, GR_LITTER_NUM_GPCS, GR_LITTER_NUM_TPC_PER_GPC],
        path.h_subdevice,
    )
    d.sm_per_tpc = sm_per_tpc
    # Local memory is indexed by the TPC's physical number: size it for the chip's maxima.
    d.tpc_slots = gpcs * tpc_per_gpc
    (heap_kib,) = info_list(path, NV2080_CTRL_CMD_FB_GET_INFO, [FB_HEAP_SIZE], path.h_subdevice)
    copy_engine = copy_engine_of(d)
    d.sm_count = d.health.sm_count = tpcs * sm_per_tpc
    d.max_warps_per_sm = warps
    d.facts = Facts(
        name=path.name,
        arch=cls.arch_of(sm_version),
        budget=heap_kib * 1024,
        queues=("compute", "copy"),
        hang_ms=path.hang_ms,
        maps_host=path.maps_host,
        bus=path.bus,
        driver=rm.release,
    )

    # Raise the clocks for compute as CUDA does for each context: without it the H200's SMs
    # stay at their 345 MHz idle clock under rig's work (measured: 256 MiB copies inside
    # the GPU ran at 655 GB/s, and 1474 GB/s boosted). stop() clears the request.
    if BOOST:
        boost(objects, PERF_BOOST_CUDA, PERF_BOOST_INFINITE)
        objects.boosted = True
    usermode = objects.new()
    rm.alloc(path.h_subdevice, usermode, d.classes.usermode)
    objects.doorbell = path.map_object(usermode, 0x10000)

    objects.engine = copy_engine
    timeline_of(d, objects, d.timeline)


def timeline_of(d: Device, objects: Objects, timeline: Timeline, suffix: str = "") -> None:
    """Make ``timeline``'s word, channels (named "compute" and "copy" and ``suffix``), arena
    and slot pool, recording what it makes in ``objects``: the device's own, or a queue's
    (:meth:`rig_nv.Device.queue`), in groups of their own placed as the device's are. Then its
    channels get their objects and windows, and the local memory launches have (where some
    was given already); it waits until the GPU has done that."""
    path, rm, ffi, memory = d.path, d.path.rm, d.ffi, d.memory
    copy_engine = d.objects.engine
    # All of it is the timeline's: a queue's stop gives it back (rig_nv.memory.Heap.disown).
    # Launches release by their QMD from the first one on: on the H200 that took launch+wait
    # from 7.0 to 6.5 us against the channel's release (docs/results/pcas-2026-12-04.txt),
    # 8.45 to 8.15 on a slower turn of its host (qmd-release-2026-12-04.txt).
    timeline.place_word(memory.own(4096, Memory.PINNED, owner=timeline), qmd_release(d), ORDER)

    joins = objects is not d.objects and QUEUE_GROUP == "device"
    if joins:
        tsg = d.objects.tsg  # the device's: its stop frees it, not the queue's
    else:
        tsg = objects.new()
        rm.alloc(
            path.h_device, tsg, cls.KEPLER_CHANNEL_GROUP_A,
            Params(ffi, "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
                   engineType=ENGINE_GRAPHICS).buf,
        )
    objects.tsg = tsg
    ctxshare = objects.new()
    rm.alloc(
        tsg, ctxshare, cls.FERMI_CONTEXT_SHARE_A,
        Params(ffi, "NV_CTXSHARE_ALLOCATION_PARAMETERS", hVASpace=path.h_vaspace,
               flags=NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC).buf,
    )
    area = memory.own(2 * CHANNEL_AREA, CHANNEL_KIND, contiguous=True, owner=timeline)
    assert area.host is not None
    view(area.host, area.length)[:] = bytes(area.length)
    timeline.compute = channel(d, objects, timeline, "compute" + suffix, 0, area, tsg,
                               ctxshare, d.classes.compute)
    if copy_engine is None:
        # No asynchronous copy engine rig can use (or the RM answered GET_ENGINES_V2
        # NOT_SUPPORTED): the copy channel joins the graphics group and copies on its GRCE.
        timeline.copy_channel = channel(d, objects, timeline, "copy" + suffix, 1, area, tsg,
                                        ctxshare, d.classes.copy)
    if joins:
        # The group is scheduled already: each new channel is enabled and put on its
        # runlist by its own schedule, once its objects are made (ctrla06fgpfifo.h).
        for ch in timeline.channels:
            rm.control(ch.handle, NVA06F_CTRL_CMD_GPFIFO_SCHEDULE,
                       Params(ffi, "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS", bEnable=1).buf)
    else:
        rm.control(tsg, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
                   Params(ffi, "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS", bEnable=1).buf)
    if copy_engine is not None:
        timeline.copy_channel = copy_group(d, objects, timeline, area, copy_engine, suffix)
    timeline.place_arenas(memory.own(SLOT_POOL, ARENA_KIND, owner=timeline),
                          memory.own(LAUNCH_ARENA, ARENA_KIND, owner=timeline))
    body = (Push()
            .set_object(SUBC_COMPUTE, d.classes.compute)
            .set_object(SUBC_COPY, d.classes.copy)
            .method(SUBC_COMPUTE, COMPUTE_SET_SHADER_LOCAL_MEMORY_WINDOW_A,
                    *hi_lo(LOCAL_WINDOW))
            .method(SUBC_COMPUTE, COMPUTE_SET_SHADER_SHARED_MEMORY_WINDOW_A,
                    *hi_lo(SHARED_WINDOW)))
    d.loader.give_local(body)
    timeline.submit(timeline.compute, body.words)
    point = timeline.submit(timeline.copy_channel,
                            Push().set_object(SUBC_COPY, d.classes.copy).words)
    timeline.wait_value(point.value, timeout_s=10.0)


def qmd_release(d: Device) -> qmd.Release | None:
    """How launches release their values: by their QMD where the layout's release is known
    (:data:`RELEASE_BY_QMD`) and nothing waits on the channel's interrupt (the QMD's release
    raises none); ``None``: by the channel, after a wait for idle."""
    if not RELEASE_BY_QMD or d.path.wakes_on_interrupt:
        return None
    return qmd.LAYOUTS[d.classes.qmd_version].release


def copy_engine_of(d: Device) -> engines.CopyEngine | None:
    """The copy engine the copy channel gets a group on (:data:`COPY_ENGINE`), or ``None``
    for the graphics group's GRCE."""
    if COPY_ENGINE == "grce":
        return None
    ces = engines.query(d.path)
    if COPY_ENGINE is None:
        return engines.choose(ces)
    forced = next((ce for ce in ces or () if ce.index == COPY_ENGINE), None)
    if forced is None:
        raise RigError(f"{d.path.name}: rig_nv.setup.COPY_ENGINE is {COPY_ENGINE!r}, a copy "
                       f"engine the GPU does not report (it reports "
                       f"{', '.join(map(str, ces or ())) or 'none'})")
    return forced


def copy_group(d: Device, objects: Objects, timeline: Timeline, area: Allocation,
               ce: engines.CopyEngine, suffix: str = "") -> Channel:
    """The copy channel, in a channel group of its own on ``ce``'s runlist, made as UVM makes
    its copy channels (nv_gpu_ops.c nvGpuOpsTsgAllocate, channelAllocate, engineAllocate):
    KEPLER_CHANNEL_GROUP_A with the address space and NV2080_ENGINE_TYPE_COPY(n), and no
    FERMI_CONTEXT_SHARE_A: a channel naming none (hContextShare 0) puts its group in legacy
    mode, where the RM makes the group's context shares on the group's address space itself
    (kernel_channel.c kchannelConstruct_IMPL, kernel_channel_group_api.c
    kchangrpapiSetLegacyMode_IMPL). Then the group is scheduled, as the graphics one."""
    path, rm, ffi = d.path, d.path.rm, d.ffi
    group = objects.new()
    rm.alloc(
        path.h_device, group, cls.KEPLER_CHANNEL_GROUP_A,
        Params(ffi, "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", hVASpace=path.h_vaspace,
               engineType=ce.engine_type).buf,
    )
    objects.copy_tsg = group
    ch = channel(d, objects, timeline, "copy" + suffix, 1, area, group, 0, d.classes.copy,
                 engine=ce.engine_type)
    rm.control(group, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
               Params(ffi, "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS", bEnable=1).buf)
    d.copy_engine = ce.index
    return ch


def channel(d: Device, objects: Objects, timeline: Timeline, name: str, index: int,
            area: Allocation, tsg: int, ctxshare: int, engine_class: int,
            engine: int = 0) -> Channel:
    """One GPFIFO channel of channel group ``tsg``, on ``index``'s part of ``area``.

    ``engine``: for a channel of a copy engine's group, its NV2080_ENGINE_TYPE_COPY(n), named in
    the channel's params (the group's engine type, which UVM's channelAllocate names too; a
    different one the RM refuses) and in its copy object's (NVB0B5_ALLOCATION_PARAMETERS
    version 1, as UVM's engineAllocate)."""
    path, rm, ffi = d.path, d.path.rm, d.ffi
    doorbell = d.objects.doorbell
    assert area.host is not None and doorbell is not None
    # Everything fallible that stop() could not find comes first: memory is the device's own.
    pb = d.memory.own(PUSHBUFFER, PUSHBUFFER_KIND, owner=timeline)
    assert pb.host is not None
    notifier = path.alloc_notifier()
    d.memory.keep(notifier, timeline)
    assert notifier.host is not None
    note = view(notifier.host, 64)
    note[:] = bytes(64)
    offset = index * CHANNEL_AREA
    userd = offset + GPFIFO_ENTRIES * 8
    p = Params(ffi, "NV_CHANNEL_ALLOC_PARAMS", hObjectError=notifier.handle,
               hObjectBuffer=area.handle, gpFifoOffset=area.gpu + offset,
               gpFifoEntries=GPFIFO_ENTRIES, hContextShare=ctxshare, engineType=engine)
    p.p.hUserdMemory[0] = area.handle
    p.p.userdOffset[0] = userd
    handle = objects.new()
    rm.alloc(tsg, handle, d.classes.gpfifo, p.buf)
    engine_object = objects.new()
    if engine_class == d.classes.compute and d.health.debuggee() is None:
        # Its graphics context keeps MMU faults' access types and SM error states.
        d.health.set_debuggee(Debuggee(path.h_device, handle, engine_object))
    if engine:
        rm.alloc(handle, engine_object, engine_class,
                 Params(ffi, "NVB0B5_ALLOCATION_PARAMETERS",
                        version=NVB0B5_ALLOCATION_PARAMETERS_VERSION_1, engineType=engine).buf)
    else:
        rm.alloc(handle, engine_object, engine_class)
    if engine_class == d.classes.compute:
        # The compute channel also drives its group's copy engine (GRCE) on subchannel 4,
        # so steps can copy between launches without leaving the channel.
        rm.alloc(handle, objects.new(), d.classes.copy)
    token = Params(ffi, "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS",
                   workSubmitToken=0xFFFFFFFF)
    rm.control(handle, NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, token.buf)
    path.attach_channel(handle)
    objects.attached.append(handle)
    ch = Channel(
        name, handle,
        ring=view(area.host + offset, GPFIFO_ENTRIES * 8),
        gpput=view(area.host + userd + 0x8C, 4),
        doorbell=doorbell,
        token=token.p.workSubmitToken,
        pushbuffer=Ring(pb.gpu, view(pb.host, pb.length), pb.length),
        wait=timeline.wait_value,
    )
    d.health.watch(name, handle, note)
    timeline.add(ch)
    return ch

def boost(objects: Objects, flags: int, duration: int) -> None:
    """Ask the RM for (or clear) the compute clock boost CUDA asks for per context."""
    p = Params(objects.ffi, "NV2080_CTRL_PERF_BOOST_PARAMS", flags=flags, duration=duration)
    objects.path.rm.control(objects.path.h_subdevice, NV2080_CTRL_CMD_PERF_BOOST, p.buf)
