"""The Driver protocol: what every rig device offers, whatever path opened it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rig_edge.facts import Facts
from rig_edge.memory import Bus, Dmabuf, Memory, Refusal, Region


@runtime_checkable
class Driver(Protocol):
    """A device. Any thread may call any method at the same time as others.

    After a fault every method but ``facts`` and ``stop`` raises :class:`rig_edge.Lost`.
    """

    @property
    def facts(self) -> Facts:
        """The device's facts; they answer even after the device is lost or stopped."""
        ...

    def alloc(self, n: int, kind: Memory) -> Region | None:
        """``n`` bytes of ``kind`` memory, or ``None`` when the driver is out of it.

        Raises :class:`ValueError` if ``n`` is not positive.
        """
        ...

    def free(self, region: Region) -> None:
        """Give back a region ``alloc`` or ``map_host`` made."""
        ...

    def map_host(self, buffer: memoryview) -> Region | Refusal:
        """Map the caller's memory for the GPU, or say why not."""
        ...

    def dma(self, region: Region) -> Dmabuf | Bus:
        """Give another device ``region``: a new dma-buf (:class:`Dmabuf`), or its bus ranges
        or the reason it cannot reach them (:class:`Bus`), as the device's path does; raises
        :class:`rig_edge.RigError` if it can do neither."""
        ...

    def sleep(self, timeout_s: float) -> None:
        """Sleep until the device signals progress or ``timeout_s`` passes; raises its faults."""
        ...

    def stop(self) -> None:
        """Give back what the device holds; the GPU can be opened again."""
        ...
