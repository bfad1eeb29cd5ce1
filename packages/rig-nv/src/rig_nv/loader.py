"""A device's loaded code: images loaded from cubins (:func:`rig_nv.launch.load`), rig's own
copy kernels, the compute engine's local memory, grown for the launches that need more, and
the grid workspace of cooperative launches.

Rules: local memory only grows, and the memory of an old size is kept until the device stops
(earlier launches may still use it). Every queue's compute channel is given each size. The
new size is known to launches (:attr:`Loader.slm`) only once the commands that give it are
submitted, so no launch that needs it runs before them. Growth takes this part's own lock.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Region, RigError
from rig_nv import grids
from rig_nv import launch as launching
from rig_nv.push import (
    COMPUTE_SET_SHADER_LOCAL_MEMORY_A,
    COMPUTE_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A,
    SUBC_COMPUTE,
    Push,
    hi_lo,
)

if TYPE_CHECKING:
    from rig_nv.device import Device
    from rig_nv.launch import Image


class Loader:
    """The code and local memory of ``device``."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.slm = 0  # local memory per thread the compute engine has been given
        self._local: list[Region] = []
        self._given: tuple[int, int] | None = None  # the last local memory: (address, per TPC)
        self._builtins: Image | None = None
        self._workspace: Region | None = None
        # rig_nv.copies.kernel_copy's launches, resolved for the sizes last copied:
        # (bytes, aligned, slm) -> ((prepared, packer, parameter offset, at, count), ...).
        self.copy_launches: dict[tuple[int, bool, int], tuple[tuple[Any, ...], ...]] = {}
        self._lock = threading.Lock()

    def load(self, cubin: bytes) -> Image:
        """As :meth:`rig_nv.Device.load`."""
        return launching.load(self.device, cubin)

    def ensure_local(self, per_thread: int) -> None:
        """Give the compute engine at least ``per_thread`` bytes of local memory per thread.
        Raises :class:`rig_edge.RigError` when there is no memory for it."""
        d = self.device
        with self._lock:
            if per_thread <= self.slm:
                return
            per_tpc = -(-(-(-per_thread * 32 // 0x200) * 0x200) * d.max_warps_per_sm
                        * d.sm_per_tpc // 0x8000) * 0x8000
            region = d.alloc(per_tpc * d.tpc_slots, Memory.DEVICE)
            if region is None:
                raise RigError(f"{d.facts.name}: no memory for {per_thread} bytes of local "
                               "memory per thread")
            # Earlier launches may still use the old memory: it is kept until the device stops.
            self._local.append(region)
            self._given = (region.gpu, per_tpc)
            for t in d.timelines():  # every queue's compute channel runs launches
                body = Push()
                self.give_local(body)
                t.submit(t.compute, body.words)
            self.slm = per_thread

    def give_local(self, body: Push) -> None:
        """Add to ``body`` the methods that give a compute channel the local memory launches
        have now (none before any was given)."""
        if self._given is not None:
            gpu, per_tpc = self._given
            body.method(SUBC_COMPUTE, COMPUTE_SET_SHADER_LOCAL_MEMORY_A, *hi_lo(gpu))
            body.method(SUBC_COMPUTE, COMPUTE_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A,
                        *hi_lo(per_tpc), 0xFF)

    def grid_workspace(self) -> Region:
        """The grid workspace cooperative launches share (:mod:`rig_nv.grids`), made on first
        use. Raises :class:`rig_edge.RigError` when there is no memory for it."""
        with self._lock:
            if self._workspace is None:
                self._workspace = grids.make_workspace(self.device)
            return self._workspace

    def copy_kernels(self) -> Image | None:
        """rig's copy kernels for this GPU (loaded once), or None where none ships."""
        if self._builtins is None:
            data = launching.builtin_cubin("copy", self.device.arch)
            if data is None:
                return None
            # rig's own loading is not the user's work: a profile open now leaves it out.
            t = self.device.timeline
            profile = t.set_profile(None)
            try:
                self._builtins = launching.load(self.device, data)
            finally:
                t.set_profile(profile)
        return self._builtins
