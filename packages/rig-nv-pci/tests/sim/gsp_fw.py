"""The simulated GSP firmware: what GSP-RM does once booter_load starts the GSP's RISC-V core,
as far as the host sees it. LibOS reads its arguments from MAILBOX0/1, GSP-RM finds RMARGS,
walks the shared memory's page table, creates the status queue and serves the command queue
(sim/gsp_peer.py); it needs GSP_SET_SYSTEM_INFO, hands the CPU a sequencer and sends
GSP_INIT_DONE once it ran; at UNLOADING_GUEST_DRIVER it suspends; a function reset ends it.

Written from NVIDIA's interfaces (open-gpu-kernel-modules 570.144), not from rig_nv_pci. What
it found, and why it stopped, is in :attr:`GspFirmware.log` and :attr:`GspFirmware.failure`.
Each structure and its source: docs/rig-nv-pci-modules/sim-gsp_fw.md."""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import gsp_peer, regs

if TYPE_CHECKING:
    from .gpu import SimGpu

REGION = struct.Struct("<QQQBB6x")
KIND_CONTIGUOUS, LOC_SYSMEM = 1, 1
QUEUE_INIT = struct.Struct("<QI4xQQ")
PAGE = 0x1000
EV_GSP_INIT_DONE = 0x1001
EV_GSP_RUN_CPU_SEQUENCER = 0x1002
PROCESSOR_SUSPENDED = 0x80000000  # LIBOS_INTERRUPT_PROCESSOR_SUSPENDED, in MAILBOX0
FN_GSP_SET_SYSTEM_INFO = 72
# kernel_gsp.c _kgspInitLibosLoggingStructures (logInitValues, then the family's LOGKRNL) and
# kgspSetupLibosInitArgs_IMPL's RMARGS: the regions a 570.144 CPU-RM names
LIBOS_REGIONS = ("LOGINIT", "LOGINTR", "LOGRM", "LOGMNOC", "LOGKRNL", "RMARGS")
FN_SET_REGISTRY = 73
# g_os_nvoc.h PACKED_REGISTRY_TABLE {NvU32 size, numEntries} then PACKED_REGISTRY_ENTRY
# {NvU32 nameOffset; NvU8 type; NvU32 data, length} (16 bytes), names from the table's start
REGISTRY_ENTRY = struct.Struct("<IB3xII")
SYSTEM_INFO_SIZE = 928  # sizeof(GspSystemInfo), worked from the header in test_sysinfo.py
SEQ_REG_WRITE, SEQ_REG_POLL, SEQ_DELAY_US = 0, 2, 3  # GSP_SEQ_BUF_OPCODE
# the sequencer the simulated GSP sends: registers it writes and the flag it waits for
SEQ_REG_A = regs.SW_SCRATCH + 4 * 0x30
SEQ_REG_B = regs.SW_SCRATCH + 4 * 0x31
SEQ_DONE = regs.SW_SCRATCH + 4 * 0x32
SEQ_VALUE_A, SEQ_VALUE_B = 0x5EC0_0A0A, 0x5EC0_0B0B


def sequencer_payload(commands: list[tuple[int, ...]], size_dwords: int = 64) -> bytes:
    """rpc_run_cpu_sequencer_v17_00 holding ``commands`` (each an opcode and its arguments)."""
    words = [w for c in commands for w in c]
    return struct.pack(f"<10I{len(words)}I", size_dwords, len(words), *[0] * 8, *words)


def default_sequencer() -> bytes:
    """Two writes, a poll of the first, a delay, then the flag the GSP waits for."""
    return sequencer_payload([
        (SEQ_REG_WRITE, SEQ_REG_A, SEQ_VALUE_A),
        (SEQ_REG_POLL, SEQ_REG_A, 0xFFFF_FFFF, SEQ_VALUE_A, 100_000, 1),
        (SEQ_DELAY_US, 5),
        (SEQ_REG_WRITE, SEQ_REG_B, SEQ_VALUE_B),
        (SEQ_REG_WRITE, SEQ_DONE, 1),
    ])


def name_id(name: str) -> int:
    out = 0
    for c in name.encode()[:8]:
        out = out << 8 | c
    return out


def peer_module() -> ModuleType:
    """sim/gsp_peer.py, the GSP's end of the queues."""
    return gsp_peer


class GspFirmware:
    """Install with :meth:`install`; runs when the GSP's RISC-V core starts. ``init_done``:
    whether GSP-RM reports GSP_INIT_DONE; ``sequencer``: the RUN_CPU_SEQUENCER payload it sends
    first (:func:`default_sequencer` unless given; to be answered its last command writes 1 to
    :data:`SEQ_DONE`), none with ``no_sequencer``; ``suspend_on_unload``: whether it suspends
    after UNLOADING_GUEST_DRIVER; ``peer_kw`` configure the queue peer."""

    def __init__(self, gpu: SimGpu, *, init_done: bool = True,
                 sequencer: bytes | None = None, no_sequencer: bool = False,
                 suspend_on_unload: bool = True, **peer_kw: Any) -> None:
        self.gpu = gpu
        self.init_done = init_done
        self.suspend_on_unload = suspend_on_unload
        self.suspended = False
        self.boots = 0
        self.sequencer = None if no_sequencer else sequencer or default_sequencer()
        self.system_info: bytes | None = None
        self.registry: dict[str, int] = {}  # SET_REGISTRY's DWORDs, by name
        self.sequencer_done = False
        self.peer_kw = peer_kw
        self.peer: Any = None
        self.regions: dict[str, tuple[int, int, int, int]] = {}  # name -> pa, size, kind, loc
        self.queue_init: tuple[int, int, int, int] | None = None
        self.log: list[str] = []
        self.failure: str | None = None
        self.on_boot: list[Callable[[], None]] = []  # run as each boot starts GSP-RM

    def install(self) -> GspFirmware:
        self.gpu.on_gsp_start = self.start
        self.gpu.on_gsp_start_at = self.start_at
        self.gpu.on_doorbell = self.doorbell
        self.gpu.on_write[SEQ_DONE] = self._sequencer_ran
        self.gpu.on_reset.append(self.reset)
        return self

    def reset(self) -> None:
        """A function reset: nothing runs on the GSP any more (its queues unserved) and
        nothing of the last boot is kept but what :attr:`log` says of it."""
        self.peer, self.suspended, self.sequencer_done = None, False, False
        self.log.append("function reset")

    def _sequencer_ran(self, value: int) -> None:
        if value != 1 or self.sequencer_done or self.peer is None:
            return
        self.sequencer_done = True
        self.log.append("sequencer ran")
        self._init_done()

    def _init_done(self) -> None:
        if self.init_done:
            self.peer.event(EV_GSP_INIT_DONE)
            self.log.append("GSP_INIT_DONE sent")

    def _check_system_info(self) -> bool:
        info = [q for q in self.peer.requests if q.function == FN_GSP_SET_SYSTEM_INFO]
        if not info:
            self._fail("no GSP_SET_SYSTEM_INFO before the boot")
            return False
        self.system_info = payload = bytes(info[0].payload)
        if len(payload) != SYSTEM_INFO_SIZE:
            self._fail(f"GSP_SET_SYSTEM_INFO of {len(payload)} bytes, not {SYSTEM_INFO_SIZE}")
            return False
        (bar0,) = struct.unpack_from("<Q", payload, 0)
        if bar0 != self.gpu.bar0_address:
            self._fail(f"GSP_SET_SYSTEM_INFO gpuPhysAddr 0x{bar0:x} is not BAR 0's bus address "
                       f"0x{self.gpu.bar0_address:x}")
            return False
        (mirror, size) = struct.unpack_from("<II", payload, 80)
        if (mirror, size) != (self.gpu.config_mirror, 0x1000):
            # GSP-RM reads the GPU's config space through this window of BAR 0
            self._fail(f"GSP_SET_SYSTEM_INFO pciConfigMirrorBase 0x{mirror:x} (size "
                       f"0x{size:x}) is not the chip's config mirror "
                       f"0x{self.gpu.config_mirror:x}")
            return False
        self.log.append(f"system info: BAR 0 at 0x{bar0:x}")
        return self._read_registry()

    def _read_registry(self) -> bool:
        """SET_REGISTRY's DWORD entries into :attr:`registry` (a malformed table fails)."""
        sent = [q for q in self.peer.requests if q.function == FN_SET_REGISTRY]
        table = bytes(sent[0].payload) if sent else b""
        if len(table) < 8 or struct.unpack_from("<I", table)[0] != len(table):
            self._fail(f"SET_REGISTRY's table of {len(table)} bytes is malformed")
            return False
        (count,) = struct.unpack_from("<I", table, 4)
        for i in range(count):
            at, kind, data, length = REGISTRY_ENTRY.unpack_from(table, 8 + 16 * i)
            name = table[at:table.index(b"\0", at)].decode()
            if kind == 1 and length == 4:  # REGISTRY_TABLE_ENTRY_TYPE_DWORD
                self.registry[name] = data
        return True

    def doorbell(self) -> None:
        if self.peer is None or self.suspended:
            return
        if not self.gpu.bus_master():  # its queues lie in system memory: nothing is read
            self.gpu.unissued.append("the GSP reading its command queue")
            return
        self.peer.doorbell()
        if self.peer.unloaded and self.suspend_on_unload:
            self.suspended = True
            self.gpu.gsp.set_mailbox(0, PROCESSOR_SUSPENDED)
            self.gpu.gsp.halt_riscv()
            self.log.append("suspended")

    def _fail(self, why: str) -> None:
        self.failure = why
        self.log.append("stopped: " + why)

    def start(self) -> None:
        """Started by booter_load: LibOS finds its arguments' address in MAILBOX1:MAILBOX0."""
        gsp = self.gpu.gsp
        self.start_at(gsp.mailbox(1) << 32 | gsp.mailbox(0))

    def start_at(self, args: int, coherent: bool = True) -> None:
        """Started by the FMC (Hopper, Blackwell), which hands LibOS its arguments' address
        from GSP_FMC_BOOT_PARAMS.gspRmParams.bootArgsOffset and whether its target is
        COHERENT_SYSTEM. A NONCOHERENT_SYSTEM read of cached host memory (sim/gpu.py
        HostMemory.cached) does not snoop the CPU's caches: the simulator takes what DRAM
        holds to be stale zeros, so LibOS finds no arguments."""
        self.boots += 1
        self.peer, self.suspended, self.sequencer_done = None, False, False
        self.regions, self.queue_init, self.system_info = {}, None, None
        self.registry = {}
        for hook in self.on_boot:
            hook()
        self.log.append(f"libos args at 0x{args:x}")
        raw = self.gpu.dma(args, PAGE, "the GSP reading its LibOS arguments")
        if raw is None:
            self._fail(f"no host memory at the LibOS arguments' 0x{args:x}")
            return
        if not coherent and self.gpu.host.cached:
            self.log.append("LibOS arguments read non-coherently from cached memory: stale")
            raw = memoryview(bytes(PAGE))
        names = {name_id(n): n for n in LIBOS_REGIONS}
        for at in range(0, PAGE, REGION.size):
            id8, pa, size, kind, loc = REGION.unpack_from(raw, at)
            if id8 == 0:
                break
            self.regions[names.get(id8, f"0x{id8:x}")] = (pa, size, kind, loc)
        if "RMARGS" not in self.regions:
            self._fail(f"no RMARGS among the LibOS regions {sorted(self.regions)}")
            return
        for name, (pa, size, kind, loc) in self.regions.items():
            if (kind, loc) != (KIND_CONTIGUOUS, LOC_SYSMEM) or self.gpu.dma(
                    pa, size, f"the GSP reading LibOS region {name}") is None:
                self._fail(f"LibOS region {name} (0x{pa:x}+0x{size:x}, kind {kind}, "
                           f"loc {loc}) is not contiguous host memory")
                return
        pa, size, _, _ = self.regions["RMARGS"]
        rm = self.gpu.dma(pa, QUEUE_INIT.size, "the GSP reading RMARGS")
        assert rm is not None
        shared, entries, cmd, stat = QUEUE_INIT.unpack_from(rm)
        self.queue_init = (shared, entries, cmd, stat)
        self.log.append(f"queues at 0x{shared:x}: {entries} pages, cmd 0x{cmd:x} stat 0x{stat:x}")
        mem = self.gpu.dma(shared, entries * PAGE, "the GSP reading its queues")
        if mem is None or not cmd < stat < entries * PAGE:
            self._fail(f"the queue memory 0x{shared:x} ({entries} pages, cmd 0x{cmd:x}, "
                       f"stat 0x{stat:x}) is not host memory the GSP can use")
            return
        table = struct.unpack_from(f"<{entries}Q", mem)
        if list(table) != [shared + i * PAGE for i in range(entries)]:
            self._fail("the queue page table does not map the shared memory's pages")
            return
        self.peer = peer_module().Peer(mem, cmd, stat, entries * PAGE - stat, **self.peer_kw)
        try:
            self.peer.boot()
        except AssertionError as e:
            self._fail(f"the command queue is unusable: {e}")
            return
        self.peer.service()  # what the CPU posted before the boot (SET_SYSTEM_INFO, ...)
        if not self._check_system_info():
            return
        if self.sequencer is None:
            self._init_done()
            return
        self.peer.event(EV_GSP_RUN_CPU_SEQUENCER, self.sequencer)
        self.log.append("RUN_CPU_SEQUENCER sent")
