"""The simulated GPU's BAR 1, as the host and other devices reach it through the page tables
under GSP-RM's BAR 1 root (the static info's bar1PdeBase, :data:`BAR1_PDB`), which a GSP
client's CPU-RM writes (kbusPatchBar1Pdb_GSPCLIENT). A host view must map contiguously to
registered video memory (one to one where the MMU is not simulated); a view can also be
mapped at a process address of the caller's choosing (:meth:`SimBar1.place`, as rig_pci maps
a BAR's file with MAP_FIXED). Other devices' requests on the machine's bus go through a BAR 1
TLB, kept until the client invalidates BAR 1's root. Notes: docs/rig-nv-pci-modules/sim-gsp_rm.md.
Written from NVIDIA's interfaces, importing nothing of rig_nv_pci."""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable

from rig_pci import libc

from . import gmmu
from .gpu import SimGpu

RESERVED = 2 << 20  # the FB's first bytes, a reserved region (GSP-RM's own)
BAR1_PDB = RESERVED - 0x1000  # GSP-RM's BAR 1 root, in it
# kern_bus_gm107.c kbusInitBar1_GM107: "Reduce BAR1 VA space by FERMI_SMALL_PAGESIZE for host
# overfetch bug WAR (Bug 529932/525381)"; FERMI_SMALL_PAGESIZE (fermi_dma.h) is RM_PAGE_SIZE,
# 4 KiB: no BAR 1 mapping lies in the BAR's last 4 KiB
BAR1_OVERFETCH_PAD = 0x1000
PAGE = 0x1000


class SimBar1:
    """BAR 1 of ``size`` bytes over video memory ``vram`` (the memfd ``vram_fd`` mapped),
    its tables of MMU format ``version`` walked where ``walks``; ``registered(fb, n)`` says
    whether video memory is registered with GSP-RM. Answers other devices' requests on
    ``gpu``'s machine bus (:meth:`request`)."""

    def __init__(self, gpu: SimGpu, vram_fd: int, vram: mmap.mmap, size: int, *, version: int,
                 walks: bool, registered: Callable[[int, int], bool]) -> None:
        self.gpu, self.size, self.version, self.walks = gpu, size, version, walks
        self._vram_fd, self._vram, self._registered = vram_fd, vram, registered
        # BAR 1 page -> the page's translation, under a lock of its own, since another GPU's
        # PBDMA asks while holding its own lock (two GPUs each reaching the other must not
        # wait on each other)
        self.tlb: dict[int, gmmu.Translation] = {}
        self.requests = 0
        self._lock = threading.Lock()
        gpu.host.devices.append(self.request)

    def read64(self, fb: int) -> int:
        return int.from_bytes(self._vram[fb:fb + 8], "little")

    def forget(self) -> None:
        """Empty the BAR 1 TLB (an invalidate of BAR 1's root, a boot, a reset)."""
        with self._lock:
            self.tlb.clear()

    def overfetch_mapped(self, root: int = BAR1_PDB) -> bool:
        """Whether BAR 1's last 4 KiB, which CPU-RM never maps (kbusInitBar1_GM107's host
        overfetch WAR), is mapped through the BAR 1 tables under ``root``."""
        try:
            gmmu.translate(self.read64, root, self.size - BAR1_OVERFETCH_PAD, self.version)
        except gmmu.MmuFault:
            return False
        return True

    def view(self, offset: int, length: int) -> memoryview:
        """The host's view of BAR 1's ``[offset, offset+length)``."""
        fb = self.fb(offset, length)
        return memoryview(self._vram)[fb:fb + length]

    def place(self, offset: int, length: int, at: int) -> None:
        """Map BAR 1's ``length`` bytes at ``offset`` at the process address ``at`` (page
        aligned, over a range the caller reserved: MAP_FIXED), as rig_pci maps a BAR's file
        there: the video memory BAR 1's tables map at ``offset``, checked as :meth:`view`
        checks it, sharing its pages (translated once, here, as :meth:`view` translates)."""
        fb = self.fb(offset, length)
        got = libc.mmap(at, length, libc.PROT_READ | libc.PROT_WRITE,
                        libc.MAP_SHARED | libc.MAP_FIXED, self._vram_fd, fb)
        assert got == at

    def fb(self, offset: int, length: int) -> int:
        """The FB offset of BAR 1's ``[offset, offset+length)``: mapped by BAR 1's tables,
        contiguously, to registered video memory (one to one without ``walks``)."""
        if offset + length > self.size:
            raise AssertionError(f"BAR 1 view 0x{offset:x}+0x{length:x} out of range")
        fb = offset
        if self.walks:
            try:
                first = gmmu.translate(self.read64, BAR1_PDB, offset, self.version)
                for page in range(offset, offset + length, PAGE):
                    where = gmmu.translate(self.read64, BAR1_PDB, page, self.version)
                    if not where.video or where.address != first.address + page - offset:
                        raise AssertionError(f"BAR 1 at 0x{page:x}: not contiguous video "
                                             "memory")
            except gmmu.MmuFault as e:
                raise AssertionError(f"BAR 1 at 0x{offset:x} is not mapped: {e}") from e
            fb = first.address
        if self._registered(fb, length):
            return fb
        raise AssertionError(f"BAR 1 at 0x{offset:x}: no registered video memory there")

    def request(self, address: int, n: int) -> memoryview | None:
        """Another device's request for ``n`` bytes at bus ``address`` (one page at most):
        ``None`` outside this GPU's BAR 1, else the video memory the BAR 1 tables map there
        (through the BAR 1 TLB); LookupError where they map none."""
        offset = address - self.gpu.bar1_address
        if not 0 <= offset < self.size:
            return None
        if offset % PAGE + n > PAGE or offset + n > self.size:
            raise LookupError(f"bus 0x{address:x} (+{n}) crosses a page of BAR 1")
        fb = offset
        if self.walks:
            with self._lock:
                page = self.tlb.get(offset >> 12)
                if page is None:
                    try:
                        page = gmmu.translate(self.read64, BAR1_PDB, offset & ~(PAGE - 1),
                                              self.version)
                    except gmmu.MmuFault as e:
                        raise LookupError(f"bus 0x{address:x}: BAR 1 of the GPU at "
                                          f"0x{self.gpu.bar1_address:x} maps nothing at "
                                          f"0x{offset:x} ({e})") from None
                    self.tlb[offset >> 12] = page
                self.requests += 1
            if not page.video:
                raise LookupError(f"bus 0x{address:x}: BAR 1 at 0x{offset:x} maps system "
                                  "memory")
            fb = page.address + offset % PAGE
        if fb + n > len(self._vram):
            raise LookupError(f"bus 0x{address:x}: BAR 1 maps beyond video memory")
        return memoryview(self._vram)[fb:fb + n]
