"""The process's addresses that every GPU it opens over PCI takes its GPU addresses from, where
system memory lies at one address for the process and the GPUs.

The Rig_nv_pci spec: "The GPUs' addresses and the process's addresses of system memory
coincide, from 64 GiB to Rig_nv.windows, which the process reserves at its first open; every
GPU it opens takes its addresses from that range. A device's stop gives back every address its
open took, once the GPU's memory regions are freed, unless the GPU stopped answering".

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-addresses.md."""

from __future__ import annotations

import threading

from rig_edge import RigError
from rig_nv.hostmem import (
    MAP_ANONYMOUS,
    MAP_FIXED_NOREPLACE,
    MAP_NORESERVE,
    MAP_PRIVATE,
    PROT_NONE,
    mmap,
    munmap,
)
from rig_nv.setup import WINDOWS
from rig_nv_pci.path.vidmem import Addresses

LOW = 64 << 30  # the spec's 64 GiB; up to Rig_nv.windows (rig_nv.setup.WINDOWS)


class Reservation:
    """The process's addresses ``[low, high)``, reserved by the first :meth:`addresses`, then
    handed out first fit (:meth:`take`) and given back (:meth:`give`), by any thread."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self._free: Addresses | None = None
        self._lock = threading.Lock()

    @property
    def reserved(self) -> bool:
        return self._free is not None

    def addresses(self) -> Reservation:
        """The range, reserved now if it is not yet; raises :class:`rig_edge.RigError`
        naming it when something of the process is mapped in it."""
        with self._lock:
            if self._free is None:
                size = self.high - self.low
                try:
                    got = mmap(self.low, size, PROT_NONE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE)
                except OSError as e:
                    raise RigError(self._refused(e.strerror or str(e))) from e
                if got != self.low:  # a kernel before 4.17 takes MAP_FIXED_NOREPLACE as a hint
                    munmap(got, size)
                    raise RigError(self._refused("the kernel placed it elsewhere"))
                self._free = Addresses(self.low, self.high)
            return self

    def _refused(self, why: str) -> str:
        return (f"the process's addresses from 0x{self.low:x} to 0x{self.high:x} cannot be "
                f"reserved ({why}): something else is mapped there (a GPU opened through "
                "NVIDIA's kernel driver reserves from 384 GiB)")

    def take(self, size: int, align: int) -> int | None:
        """``size`` bytes of the range aligned to ``align``, or ``None`` when it is full."""
        with self._lock:
            assert self._free is not None, "take before the range is reserved"
            return self._free.take(size, align)

    def give(self, at: int, size: int) -> None:
        with self._lock:
            assert self._free is not None
            self._free.give(at, size)

    @property
    def free(self) -> list[tuple[int, int]]:
        """The free runs ``(at, size)``, by address."""
        with self._lock:
            return list(self._free.free) if self._free is not None else []


PROCESS = Reservation(LOW, WINDOWS)
