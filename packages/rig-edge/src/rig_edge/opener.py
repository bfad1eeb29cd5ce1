"""Openers: a name and a way to make a device.

Names follow the spec: ``"NV"`` for GPU 0 of the kernel-driver path and ``"NV:i"`` for GPU i,
``"NV-PCI"`` and ``"NV-PCI:i"`` for the driver-less path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from rig_edge.errors import Misuse

D_co = TypeVar("D_co", covariant=True)


def opener_name(path: str, index: int) -> str:
    """The spec's name of GPU ``index`` on ``path`` ("NV" → "NV", "NV:1", ...).

    Raises :class:`Misuse` if ``index`` is no int (a bool is none) or is negative.
    """
    if not isinstance(index, int) or isinstance(index, bool):
        raise Misuse(f"a GPU index is an int, not {index!r}")
    if index < 0:
        raise Misuse(f"GPU index {index} is negative")
    return path if index == 0 else f"{path}:{index}"


@dataclass(frozen=True)
class Opener(Generic[D_co]):
    """A named way to open a device.

    ``make`` opens it and returns the device, or raises :class:`rig_edge.RigError` (usually
    :class:`rig_edge.OpenRefused`) saying why, having given back what it took except what the
    spec says stays for the process.
    """

    name: str
    make: Callable[[], D_co]

    def open(self) -> D_co:
        """Make the device (the spec's ``Rig.open_``)."""
        return self.make()

    def __str__(self) -> str:
        return self.name
