"""The simulated GPU's PBDMA and copy engine: how :class:`sim.gsp_rm.SimRm` runs the channels
a GSP client made (module functions taking the SimRm; its ``step``, ``start`` and ``stop``
call them), and what it does when one faults. The PBDMA fetches a channel once its doorbell
names it, runs its GPFIFO's methods (the host semaphore, SET_OBJECT, a copy class's one-line
copy); a compute launch or an unmapped address faults the channel, whose group's error
notifiers are written, then RC_TRIGGERED (and MMU_FAULT_QUEUED) sent.

Written from NVIDIA's interfaces (open-gpu-kernel-modules 570.144), importing nothing of
rig_nv_pci or rig_nv. Each method, field and source: docs/rig-nv-pci-modules/sim-pbdma.md."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import gmmu, runlists
from .runlists import DOORBELL

if TYPE_CHECKING:
    from .gsp_rm import SimRm

COPY_CLASSES = (0xC5B5, 0xC6B5, 0xC7B5, 0xC8B5, 0xC9B5, 0xCAB5)
COMPUTE_CLASSES = (0xC5C0, 0xC6C0, 0xC7C0, 0xC9C0, 0xCBC0, 0xCDC0, 0xCEC0)
SEND_PCAS_A = 0x2B4
# dev_ram.h: NV_RAMUSERD_CHAN_SIZE 512, NV_RAMUSERD_GP_GET dword 34, NV_RAMUSERD_GP_PUT dword 35
USERD_SIZE = 0x200
USERD_GP_GET, USERD_GP_PUT = 34 * 4, 35 * 4
PAGE = 0x1000  # the MMU reports a fault's 4 KiB page (NVC369_BUF_ENTRY ADDR_LO 31:12)


class SimFault(LookupError):
    """What stops a channel: the Xid (nverror.h), the NV2080 engine type and, for an MMU fault,
    the faulting page's address and the NV_PFAULT_FAULT_TYPE."""

    def __init__(self, why: str, xid: int = 31, engine: int = 1, address: int | None = None,
                 fault_type: int = 0) -> None:
        super().__init__(why)
        self.xid, self.engine = xid, engine
        self.address, self.fault_type = address, fault_type

    @classmethod
    def mmu(cls, fault: gmmu.MmuFault, engine: int) -> SimFault:
        """An MMU fault (Xid 31) of ``engine``, at the page of the address that faulted."""
        return cls(str(fault), XID_MMU_FAULT, engine, fault.va & ~(PAGE - 1), fault.fault_type)


XID_GR_EXCEPTION, XID_MMU_FAULT = 13, 31  # ROBUST_CHANNEL_GR_EXCEPTION, _FIFO_ERROR_MMU_ERR_FLT
ENGINE_GRAPHICS = 1  # NV2080_ENGINE_TYPE_GRAPHICS (cl2080_notification.h)
# The copy engine a GR group's copies run on (GRCE): NV2080_ENGINE_TYPE_COPY0 (0x9), the
# simulator's choice (which COPYn a chip's GRCE is, is the chip's)
ENGINE_GRCE = 0x9
EV_RC_TRIGGERED, EV_MMU_FAULT_QUEUED = 0x1004, 0x1005
RC_NOTIFIER_SCOPE_TSG = 1  # g_kernel_rc_nvoc.h RC_NOTIFIER_SCOPE
GB200_ARCH = 0x1B  # nv_ref.h NV_PMC_BOOT_42_ARCHITECTURE_GB200: GB20x's doorbell (runlists.py)


def _put32(buf: bytearray | memoryview, at: int, value: int) -> None:
    buf[at:at + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")


@dataclass
class Channel:
    handle: int
    chid: int
    gpfifo: int  # GPU address
    entries: int
    userd: int  # USERD's FB address (userdMem)
    group: int  # the channel group's handle
    notifier: int  # the error notifier's bus address (errorNotifierMem)
    instance: int  # the instance block's FB address (instanceMem)
    mthdbuf: int  # the method buffer's bus address (mthdbufMem)
    get: int = 0
    pending: list[tuple[int, int]] = field(default_factory=list)  # (method, data) to run
    sem: dict[int, int] = field(default_factory=dict)  # the semaphore methods' last data
    bound: dict[int, int] = field(default_factory=dict)  # subchannel -> class (SET_OBJECT)
    ce: dict[int, int] = field(default_factory=dict)  # copy engine methods' last data
    stalled_on: str = ""
    runlist: int = 0  # the NV2080 engine type whose runlist it is on (sim/chid.py)
    runlist_id: int = 0  # that runlist's number (sim/runlists.py)
    active: bool = False  # rung: fetching until GP_GET reaches GP_PUT and nothing waits


def rung(rm: SimRm) -> bool:
    """Whether a doorbell naming one of the channels was written since the last step: the
    word is read and cleared in one statement, which no other Python thread can split (the
    interpreter switches threads only at calls and backward jumps). The simulator sees only
    the last of several writes between two steps: a well-formed one then starts every channel
    with work, as if the others had been seen too."""
    word = DOORBELL // 4
    cells = memoryview(rm.usermode).cast("I")
    token, cells[word] = cells[word], 0
    if not token:
        return False
    rm.doorbells.append(token)
    named = runlists.decode(token, gb20x=rm.gpu.boot42 >> 24 & 0x3F == GB200_ARCH)
    if named is None or not any((c.runlist_id, c.chid) == named
                                for c in rm.channels.values()):
        rm.ignored_doorbells.append(token)
        return False
    return True


def step(rm: SimRm) -> int:
    """Run every rung channel as far as it goes; how many methods ran."""
    ran = 0
    with rm.lock:
        kick = rung(rm)
        for ch in list(rm.channels.values()):
            try:
                rm.running = ch.instance if rm.walks else None
                ch.active = ch.active or kick
                if not ch.active:
                    continue
                ran += run(rm, ch)
                ch.active = bool(ch.pending) or not _idle(rm, ch)
            except LookupError as e:
                # what the PBDMA itself read (GPFIFO entries, methods, semaphores) faults
                # as the channel's runlist's engine
                engine = ch.runlist or ENGINE_GRAPHICS
                fault = (e if isinstance(e, SimFault) else
                         SimFault.mmu(e, engine) if isinstance(e, gmmu.MmuFault) else
                         SimFault(str(e), XID_MMU_FAULT, engine))
                rm.faults.append(f"channel {ch.chid}: {e}")
                recover(rm, ch, fault)
            finally:
                rm.running = None
    return ran


def recover(rm: SimRm, ch: Channel, fault: SimFault) -> None:
    """Robust-channel recovery of ``ch``'s group (RC_NOTIFIER_SCOPE_TSG): its channels
    stopped, their notifiers written, RC_TRIGGERED (and MMU_FAULT_QUEUED) sent."""
    for other in [c for c in rm.channels.values() if c.group == ch.group]:
        del rm.channels[other.handle]
        note = rm.gpu.dma(other.notifier, 16, "GSP-RM writing an error notifier")
        if note is not None and rm.notifiers:
            struct.pack_into("<IHH", note, 8, fault.xid, fault.engine, 0xFFFF)
    if rm.firmware is not None and rm.firmware.peer is not None:
        peer = rm.firmware.peer
        peer.event(EV_RC_TRIGGERED, peer.rc_triggered(
            ch.chid, fault.xid, fault.engine, fault.address or 0,
            fault_type=fault.fault_type, scope=RC_NOTIFIER_SCOPE_TSG))
        if fault.address is not None:
            peer.event(EV_MMU_FAULT_QUEUED)


def _userd(rm: SimRm, ch: Channel) -> memoryview:
    return memoryview(rm.vram)[ch.userd:ch.userd + USERD_SIZE]


def _idle(rm: SimRm, ch: Channel) -> bool:
    (put,) = struct.unpack_from("<I", _userd(rm, ch), USERD_GP_PUT)
    return ch.get == put % ch.entries


def run(rm: SimRm, ch: Channel) -> int:
    """Run ``ch`` from its GPFIFO until it stalls or GP_GET reaches GP_PUT; how many methods
    ran."""
    ran = 0
    userd = _userd(rm, ch)
    while True:
        ran += execute(rm, ch)
        if ch.pending:
            return ran
        (put,) = struct.unpack_from("<I", userd, USERD_GP_PUT)
        if ch.get == put % ch.entries:
            return ran
        lo, hi = struct.unpack("<II", rm.read(ch.gpfifo + 8 * ch.get, 8))
        address = (lo & ~3) | (hi & 0xFF) << 32
        words = (hi >> 10) & 0x1FFFFF
        ch.pending = methods(struct.unpack(f"<{words}I", rm.read(address, 4 * words)))
        ch.get = (ch.get + 1) % ch.entries
        _put32(userd, USERD_GP_GET, ch.get)


def methods(words: tuple[int, ...]) -> list[tuple[int, int]]:
    """A GPFIFO entry's words as (subchannel << 16 | method, data) pairs."""
    out, i = [], 0
    while i < len(words):
        w = words[i]
        op, count, method = w >> 29, (w >> 16) & 0x1FFF, (w & 0xFFF) << 2
        subc = (w >> 13) & 7
        key = subc << 16
        i += 1
        if op == 4:
            out.append((key | method, count))
            continue
        for k in range(count):
            nth = {1: k, 3: 0, 5: min(k, 1)}.get(op)
            if nth is None:
                raise LookupError(f"method header 0x{w:08x}: SEC_OP {op} not simulated")
            out.append((key | (method + 4 * nth), words[i + k]))
        i += count
    return out


def execute(rm: SimRm, ch: Channel) -> int:
    """Run ``ch``'s pending methods until one stalls (a semaphore acquire); how many ran."""
    ran = 0
    state = ch.sem
    while ch.pending:
        key, data = ch.pending[0]
        method, subc = key & 0xFFFF, key >> 16
        if method == 0:
            ch.bound[subc] = data
        elif method >= 0x100:
            if ch.bound.get(subc) in COPY_CLASSES:
                try:
                    copy_engine(rm, ch, method, data)
                except gmmu.MmuFault as e:  # the copy engine's own access: the LCE
                    # of a copy group's runlist, or the GR group's GRCE
                    lce = ch.runlist if ch.runlist not in (None, ENGINE_GRAPHICS) else None
                    raise SimFault.mmu(e, lce or ENGINE_GRCE) from e
            elif ch.bound.get(subc) in COMPUTE_CLASSES and method == SEND_PCAS_A:
                raise SimFault("a compute launch: no SM is simulated", XID_GR_EXCEPTION)
        elif method in (0x5C, 0x60, 0x64, 0x68):
            state[method] = data
        elif method == 0x6C:
            address = state.get(0x5C, 0) | state.get(0x60, 0) << 32
            payload = state.get(0x64, 0) | (state.get(0x68, 0) << 32 if data >> 24 & 1 else 0)
            width = 8 if data >> 24 & 1 else 4
            operation = data & 7
            if operation == 1:
                rm.write(address, payload.to_bytes(width, "little"))
                if data >> 25 & 1:  # RELEASE_TIMESTAMP: the GPU's time at +8
                    rm.write(address + 8, (rm.gpu.timer.now() & ~0x1F).to_bytes(8, "little"))
            elif operation in (2, 3):
                value = int.from_bytes(rm.read(address, width), "little")
                done = (value >= payload if operation == 2 else
                        (value - payload) % (1 << 8 * width) < 1 << (8 * width - 1))
                if not done:
                    ch.stalled_on = f"acquire 0x{address:x} >= {payload}"
                    return ran
            elif operation == 6:
                if data >> 27 & 0xF != 5:
                    raise LookupError(f"SEM_EXECUTE reduction {data >> 27 & 0xF} not "
                                      "simulated")
                value = int.from_bytes(rm.read(address, width), "little")
                rm.write(address, ((value + payload) % (1 << 8 * width)).to_bytes(
                    width, "little"))
            else:
                raise LookupError(f"SEM_EXECUTE operation {operation} not simulated")
        ch.pending.pop(0)
        ran += 1
    ch.stalled_on = ""
    return ran


def copy_engine(rm: SimRm, ch: Channel, method: int, data: int) -> None:
    """A method of a copy class: kept, and at LAUNCH_DMA the copy and its semaphore run."""
    if method != 0x300:
        ch.ce[method] = data
        return
    if data & (1 << 9 | 1 << 10):
        raise LookupError(f"LAUNCH_DMA 0x{data:x}: multi-line or remapped copies are not "
                          "simulated")
    if data & 3:
        src = ch.ce.get(0x400, 0) << 32 | ch.ce.get(0x404, 0)
        dst = ch.ce.get(0x408, 0) << 32 | ch.ce.get(0x40C, 0)
        rm.write(dst, rm.read(src, ch.ce.get(0x418, 0)))
    semaphore = data >> 3 & 3
    if semaphore == 1:
        address = ch.ce.get(0x240, 0) << 32 | ch.ce.get(0x244, 0)
        rm.write(address, ch.ce.get(0x248, 0).to_bytes(4, "little"))
    elif semaphore:
        raise LookupError(f"LAUNCH_DMA 0x{data:x}: semaphore type {semaphore} not simulated")

