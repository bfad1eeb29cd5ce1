"""Pushbuffer encoding and the methods rig sends: host (channel), copy engine, compute.

Method headers follow NVIDIA's "FIFO_DMA" formats (open-gpu-doc manuals/.../dev_ram.ref.txt;
classes/host/clc56f.h): ADDRESS 11:0 = method offset >> 2, SUBCHANNEL 15:13, COUNT 28:16,
SEC_OP 31:29 (1 incrementing, 3 non-incrementing, 4 immediate, 5 increment-once).
Offsets are those of HOPPER_CHANNEL_GPFIFO_A (clc86f.h), HOPPER_DMA_COPY_A (clc8b5.h) and
HOPPER_COMPUTE_A (clcbc0.h); the Ampere/Ada classes (c56f, c6b5/c7b5, c6c0/c7c0) use the same
offsets for every method here.
"""

from __future__ import annotations

from array import array

# Subchannels (dev_ram.ref.txt: on the GR runlist 1 = compute, 4 = the GR copy engine).
SUBC_HOST = 0
SUBC_COMPUTE = 1
SUBC_COPY = 4

# SEC_OP values, bits 31:29.
INCREMENTING = 1
NON_INCREMENTING = 3
IMMEDIATE = 4

# Host methods (clc86f.h; subchannel ignored).
SET_OBJECT = 0x000
NON_STALL_INTERRUPT = 0x020
MEM_OP_A = 0x028
SEM_ADDR_LO = 0x05C
SEM_EXECUTE = 0x06C
WFI = 0x078

# SEM_EXECUTE fields (clc86f.h / clc56f.h).
SEM_OP_ACQUIRE = 0
SEM_OP_RELEASE = 1
SEM_OP_ACQ_STRICT_GEQ = 2
SEM_OP_ACQ_CIRC_GEQ = 3
SEM_ACQUIRE_SWITCH_TSG = 1 << 12
SEM_RELEASE_WFI = 1 << 20
SEM_PAYLOAD_64BIT = 1 << 24
SEM_RELEASE_TIMESTAMP = 1 << 25

# MEM_OP_D operations (bits 31:27) and MEM_OP_C membar types (clc56f.h).
MEM_OP_MEMBAR = 5
MEM_OP_L2_SYSMEM_INVALIDATE = 0xE
MEM_OP_L2_FLUSH_DIRTY = 0x10
MEMBAR_SYS = 0

# Copy engine methods (clc8b5.h).
CE_SET_SEMAPHORE_A = 0x240
CE_LAUNCH_DMA = 0x300
CE_OFFSET_IN_UPPER = 0x400
CE_LINE_LENGTH_IN = 0x418
CE_SET_REMAP_CONST_A = 0x700
CE_SET_REMAP_COMPONENTS = 0x708

# LAUNCH_DMA fields (clc8b5.h).
CE_TRANSFER_NONE = 0
CE_TRANSFER_PIPELINED = 1
CE_TRANSFER_NON_PIPELINED = 2
CE_FLUSH_ENABLE = 1 << 2
CE_SEMAPHORE_RELEASE_ONE_WORD = 1 << 3
CE_SEMAPHORE_RELEASE_FOUR_WORD = 2 << 3
CE_SRC_PITCH = 1 << 7
CE_DST_PITCH = 1 << 8
CE_REMAP_ENABLE = 1 << 10
CE_SEMAPHORE_PAYLOAD_64BIT = 1 << 27
# The copy engine moves at most 2^32 - 1 bytes a launch (LINE_LENGTH_IN is 32 bits); NVIDIA's
# UVM driver splits larger copies the same way (uvm_maxwell_ce.c).
CE_MAX_LINE = (1 << 32) - 1
# We split at 2 GiB so each chunk stays well inside one 32-bit length and 2 MiB aligned.
CE_CHUNK = 1 << 31

# Compute methods (clcbc0.h; the same offsets in clc6c0.h/clc7c0.h).
COMPUTE_SET_SHADER_SHARED_MEMORY_WINDOW_A = 0x2A0
COMPUTE_SEND_PCAS_A = 0x2B4
COMPUTE_SEND_SIGNALING_PCAS2_B = 0x2C0
COMPUTE_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A = 0x2E4
COMPUTE_SET_SHADER_LOCAL_MEMORY_A = 0x790
COMPUTE_SET_SHADER_LOCAL_MEMORY_WINDOW_A = 0x7B0
COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI = 0x1698
# SEND_SIGNALING_PCAS2_B PCAS_ACTION values (clcbc0.h): NVK sends INVALIDATE_COPY_SCHEDULE
# (3), tinygrad (runtime/ops_nv.py) PREFETCH_SCHEDULE (9), as rig does. On the H200
# PREFETCH_SCHEDULE took a one-thread launch+wait from 7.3-8.0 to 7.0 us and a step's entry
# from 1.79-1.88 to 1.72, QMDs rewritten in place included (docs/results/pcas-2026-12-04.txt).
PCAS_PREFETCH_SCHEDULE = 9
PCAS_ACTION = PCAS_PREFETCH_SCHEDULE


def header(subchannel: int, method: int, count: int, op: int = INCREMENTING) -> int:
    """A method header: ``count`` data words follow for ``method`` on ``subchannel``."""
    if not 0 <= count <= 0x1FFF:
        raise ValueError(f"a method header carries 0..8191 words, not {count}")
    if method & 3 or not 0 <= method < 0x4000:
        raise ValueError(f"method offset 0x{method:x} is not a word offset below 0x4000 "
                         "(the header's ADDRESS field is bits 11:0)")
    if not 0 <= subchannel < 8:
        raise ValueError(f"subchannel {subchannel} is not 0..7")
    return (op << 29) | (count << 16) | (subchannel << 13) | (method >> 2)


def hi_lo(value: int) -> tuple[int, int]:
    """(upper 32 bits, lower 32 bits), the order the copy engine and compute class take."""
    return (value >> 32) & 0xFFFFFFFF, value & 0xFFFFFFFF


def lo_hi(value: int) -> tuple[int, int]:
    """(lower 32 bits, upper 32 bits), the order host semaphore methods take."""
    return value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF


def send_qmd_words(address: int) -> tuple[int, int, int, int]:
    """The words that send the QMD at GPU ``address`` (256-byte aligned) to the compute
    engine to fetch and schedule: SEND_PCAS_A with the address (at [1]), then
    SEND_SIGNALING_PCAS2_B with :data:`PCAS_ACTION`. The one home of how rig launches a QMD."""
    return (header(SUBC_COMPUTE, COMPUTE_SEND_PCAS_A, 1), address >> 8,
            header(SUBC_COMPUTE, COMPUTE_SEND_SIGNALING_PCAS2_B, 1), PCAS_ACTION)


# The headers of a copy engine launch (Push.copy), made once: every copy pays for them.
_COPY_OFFSETS = header(SUBC_COPY, CE_OFFSET_IN_UPPER, 4)
_COPY_LINE = header(SUBC_COPY, CE_LINE_LENGTH_IN, 1)
_COPY_LAUNCH = header(SUBC_COPY, CE_LAUNCH_DMA, 1)
COPY_WORDS = 9  # words of one copy engine launch (Push.copy)


class Push:
    """Words of a pushbuffer being built."""

    def __init__(self) -> None:
        self.words = array("I")

    def __len__(self) -> int:
        return len(self.words)

    def method(self, subchannel: int, method: int, *data: int) -> Push:
        """An incrementing method: ``data[i]`` goes to ``method + 4*i``."""
        self.words.append(header(subchannel, method, len(data)))
        self.words.extend(data)
        return self

    def send_qmd(self, address: int) -> Push:
        """Send the QMD at GPU ``address`` (:func:`send_qmd_words`)."""
        self.words.extend(send_qmd_words(address))
        return self

    def set_object(self, subchannel: int, cls: int) -> Push:
        """Bind class ``cls`` to ``subchannel`` of this channel."""
        return self.method(subchannel, SET_OBJECT, cls)

    def semaphore_acquire(self, address: int, value: int, *, switch: bool = True) -> Push:
        """Wait until the 64-bit word at ``address`` is >= ``value`` (wrapping compare).

        While it fails, the channel's other channels of its group are served; with ``switch``
        the group gives way to other groups once all of them wait. Without it the group stays
        on until its timeslice ends: for waits on the group's own short work, which a switch
        away and back slows (dev_pbdma.ref.txt, "Semaphore switch option")."""
        return self.method(
            SUBC_HOST,
            SEM_ADDR_LO,
            *lo_hi(address),
            *lo_hi(value),
            SEM_OP_ACQ_CIRC_GEQ | SEM_PAYLOAD_64BIT | (SEM_ACQUIRE_SWITCH_TSG if switch else 0),
        )

    def semaphore_release(self, address: int, value: int, *, timestamp: bool = False,
                          interrupt: bool = False, idle: bool = True) -> Push:
        """Once all earlier work is idle and flushed, write ``value`` (64 bits) at ``address``;
        with ``idle`` false, once the channel reaches it (as :meth:`timestamp` says).

        With ``timestamp`` the GPU's nanosecond clock lands at ``address + 8`` (16-byte aligned).
        With ``interrupt`` a non-stall interrupt follows, for a waiter whose sleep it ends
        (:attr:`rig_nv.rm.Path.wakes_on_interrupt`).
        """
        op = SEM_OP_RELEASE | (SEM_RELEASE_WFI if idle else 0) | SEM_PAYLOAD_64BIT
        if timestamp:
            op |= SEM_RELEASE_TIMESTAMP
        self.method(SUBC_HOST, SEM_ADDR_LO, *lo_hi(address), *lo_hi(value), op)
        return self.interrupt() if interrupt else self

    def interrupt(self) -> Push:
        """Raise the channel's non-stall interrupt once the GPU reaches this point."""
        return self.method(SUBC_HOST, NON_STALL_INTERRUPT, 0)

    def timestamp(self, address: int, idle: bool = True) -> Push:
        """Once earlier work is idle, write the GPU's nanosecond clock at ``address + 8``;
        with ``idle`` false, once the channel reaches it (earlier work sent, not done: a wait
        for idle would hold every channel of the group)."""
        return self.method(SUBC_HOST, SEM_ADDR_LO, *lo_hi(address), 0, 0,
                           SEM_OP_RELEASE | (SEM_RELEASE_WFI if idle else 0)
                           | SEM_PAYLOAD_64BIT | SEM_RELEASE_TIMESTAMP)

    def sysmembar(self) -> Push:
        """Make every earlier write visible to the system (MEM_OP_D = MEMBAR, SYS_MEMBAR)."""
        return self.method(SUBC_HOST, MEM_OP_A, 0, 0, MEMBAR_SYS, MEM_OP_MEMBAR << 27)

    def copy(self, dst: int, src: int, length: int) -> Push:
        """Copy ``length`` bytes from GPU address ``src`` to ``dst`` on the copy engine,
        in launches of at most :data:`CE_CHUNK` bytes, each :data:`COPY_WORDS` words: the
        source's address at [1:3] and the destination's at [3:5] (upper word first), the
        length at [6]. The first waits for earlier transfers (NON_PIPELINED)."""
        if length <= 0:
            raise ValueError(f"a copy's length must be positive, not {length}")
        kind = CE_TRANSFER_NON_PIPELINED
        for off in range(0, length, CE_CHUNK):
            s, d = src + off, dst + off
            self.words.extend((_COPY_OFFSETS, s >> 32, s & 0xFFFFFFFF, d >> 32, d & 0xFFFFFFFF,
                               _COPY_LINE, min(CE_CHUNK, length - off),
                               _COPY_LAUNCH, kind | CE_SRC_PITCH | CE_DST_PITCH))
            kind = CE_TRANSFER_PIPELINED
        return self
