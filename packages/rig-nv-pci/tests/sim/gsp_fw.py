"""The simulated GSP firmware: what GSP-RM does once booter_load starts the GSP's RISC-V core,
as far as the host sees it.

Written from NVIDIA's interfaces (open-gpu-kernel-modules 570.144), not from rig_nv_pci:

- LibOS reads the bus address of its arguments from NV_PGSP_FALCON_MAILBOX0 (low) and
  MAILBOX1 (high) (kgspProgramLibosBootArgsAddr_TU102): an array of
  LibosMemoryRegionInitArgument {u64 id8, pa, size; u8 kind, loc} of 32 bytes each
  (src/common/uproc/os/common/include/libos_init_args.h), ended by an id8 of 0, each id8 the
  name's characters with the first in the highest byte used (_kgspGenerateInitArgId);
- GSP-RM finds "RMARGS" and reads GSP_ARGUMENTS_CACHED from it; its first member,
  MESSAGE_QUEUE_INIT_ARGUMENTS (src/nvidia/inc/kernel/gpu/gsp/gsp_init_args.h), holds
  sharedMemPhysAddr (u64 at 0), pageTableEntryCount (u32 at 8), cmdQueueOffset (u64 at 16)
  and statQueueOffset (u64 at 24);
- it walks the shared memory's page table (pageTableEntryCount u64 bus addresses at its start,
  message_queue_cpu.c GspMsgQueuesInit), creates the status queue and serves the command
  queue (tests/gsp_peer.py), then sends GSP_INIT_DONE (0x1001, rpc_global_enums.h).

What it found, and why it stopped if it did, is in :attr:`GspFirmware.log` and
:attr:`GspFirmware.failure`: a GSP that cannot use its arguments sends nothing, as on hardware.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .gpu import SimGpu

REGION = struct.Struct("<QQQBB6x")
KIND_CONTIGUOUS, LOC_SYSMEM = 1, 1
QUEUE_INIT = struct.Struct("<QI4xQQ")
PAGE = 0x1000
EV_GSP_INIT_DONE = 0x1001
EV_GSP_RUN_CPU_SEQUENCER = 0x1002


def name_id(name: str) -> int:
    out = 0
    for c in name.encode()[:8]:
        out = out << 8 | c
    return out


def peer_module() -> ModuleType:
    """tests/gsp_peer.py, loaded under the name the RPC tests load it by."""
    name = "rig_nv_pci_tests_gsp_peer"
    if name not in sys.modules:
        path = Path(__file__).parent.parent / "gsp_peer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class GspFirmware:
    """Install with :meth:`install`; runs when the GSP's RISC-V core starts. ``init_done``:
    whether GSP-RM reports GSP_INIT_DONE; ``peer_kw`` configure the queue peer."""

    def __init__(self, gpu: SimGpu, *, init_done: bool = True, **peer_kw: Any) -> None:
        self.gpu = gpu
        self.init_done = init_done
        self.peer_kw = peer_kw
        self.peer: Any = None
        self.regions: dict[str, tuple[int, int, int, int]] = {}  # name -> pa, size, kind, loc
        self.queue_init: tuple[int, int, int, int] | None = None
        self.log: list[str] = []
        self.failure: str | None = None

    def install(self) -> GspFirmware:
        self.gpu.on_gsp_start = self.start
        self.gpu.on_doorbell = self.doorbell
        return self

    def doorbell(self) -> None:
        if self.peer is not None:
            self.peer.doorbell()

    def _fail(self, why: str) -> None:
        self.failure = why
        self.log.append("stopped: " + why)

    def start(self) -> None:
        gsp = self.gpu.gsp
        args = gsp.mailbox(1) << 32 | gsp.mailbox(0)
        self.log.append(f"libos args at 0x{args:x}")
        raw = self.gpu.host.view(args, PAGE)
        if raw is None:
            self._fail(f"no host memory at the LibOS arguments' 0x{args:x}")
            return
        names = {name_id(n): n for n in ("LOGINIT", "LOGINTR", "LOGRM", "RMARGS")}
        for at in range(0, PAGE, REGION.size):
            id8, pa, size, kind, loc = REGION.unpack_from(raw, at)
            if id8 == 0:
                break
            self.regions[names.get(id8, f"0x{id8:x}")] = (pa, size, kind, loc)
        if "RMARGS" not in self.regions:
            self._fail(f"no RMARGS among the LibOS regions {sorted(self.regions)}")
            return
        for name, (pa, size, kind, loc) in self.regions.items():
            if (kind, loc) != (KIND_CONTIGUOUS, LOC_SYSMEM) or self.gpu.host.view(pa, size) is None:
                self._fail(f"LibOS region {name} (0x{pa:x}+0x{size:x}, kind {kind}, "
                           f"loc {loc}) is not contiguous host memory")
                return
        pa, size, _, _ = self.regions["RMARGS"]
        rm = self.gpu.host.view(pa, QUEUE_INIT.size)
        assert rm is not None
        shared, entries, cmd, stat = QUEUE_INIT.unpack_from(rm)
        self.queue_init = (shared, entries, cmd, stat)
        self.log.append(f"queues at 0x{shared:x}: {entries} pages, cmd 0x{cmd:x} stat 0x{stat:x}")
        mem = self.gpu.host.view(shared, entries * PAGE)
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
        self.peer.service()  # what the CPU posted before the boot (SET_REGISTRY, ...)
        if self.init_done:
            self.peer.event(EV_GSP_INIT_DONE)
            self.log.append("GSP_INIT_DONE sent")
