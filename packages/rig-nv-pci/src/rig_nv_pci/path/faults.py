"""What the GSP reported about the PCI path's device (:meth:`rig_nv_pci.path.pci.PciPath.fault`,
rig_nv's optional :class:`rig_nv.rm.ReportsFaults`).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-faults.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from rig_edge import Lost
from rig_nv_pci.gsp.events import EventLog, RcTriggered
from rig_nv_pci.path.channels import ChannelMemory

# How long a device that found an error notifier written drains the GSP's queue for the
# RC_TRIGGERED that follows it (rig's own bound; past it the notifier alone is the fault).
REPORT_S = 0.1


def fault(events: EventLog | None, poll: Callable[[], None] | None,
          held: ChannelMemory | None, channels: Mapping[int, str],
          notified: bool) -> Lost | None:
    """What the GSP reported to ``events`` (drained by ``poll``; ``held`` the path's channels)
    (:class:`rig_nv.rm.ReportsFaults`): its status queue drained, the :class:`rig_edge.Fault` of
    an RC_TRIGGERED for one of ``channels`` (RM handle to the device's name), found by its ChID,
    or the :class:`rig_edge.Lost` of a RUN_CPU_SEQUENCER that failed or was cut short meanwhile
    (whichever came first), else :class:`rig_edge.Lost` while the GSP is in lockdown
    (:meth:`rig_nv_pci.gsp.events.EventLog.fault`), else ``None``. The first answer is kept and
    given again by every later call, so an exception (a KeyboardInterrupt) that strikes before
    the device recorded it does not lose the report. GSP-RM writes a stopped channel's error
    notifiers before it sends RC_TRIGGERED (kernel_gsp.c _kgspRpcRCTriggered writes them on the
    CPU only with confidential computing), so with ``notified`` the queue is drained for up to
    :data:`REPORT_S` for the report."""
    if events is None:
        return None
    deadline = time.monotonic() + REPORT_S
    while True:
        if poll is not None:
            poll()
        found = events.fault(lambda rc: channel_of(held, rc, channels), keep=True)
        if found is not None or not notified or time.monotonic() > deadline:
            return found
        time.sleep(50e-6)


def channel_of(held: ChannelMemory | None, rc: RcTriggered,
               channels: Mapping[int, str]) -> str | None:
    """The name in ``channels`` of the channel ``rc`` stopped (``held`` the path's channels):
    CPU-RM looks a channel up by its ChID in the ChID space of the event's engine, and only for
    the PF's own (gfid 0, _kgspRpcRCTriggered's IS_GFID_PF). The path keys its ChID spaces by
    the group's engine type and cannot tell which runlist a copy engine serves, so a ChID that
    one channel of ``channels`` holds names it whatever the engine; two holding it, the engine's
    space decides."""
    if rc.gfid or held is None:
        return None
    mine = [(h, held.channels[h].runlist) for h in channels
            if h in held.channels and held.channels[h].chid == rc.chid]
    if len(mine) > 1:
        mine = [(h, runlist) for h, runlist in mine if runlist == rc.engine_type]
    return channels[mine[0][0]] if len(mine) == 1 else None
