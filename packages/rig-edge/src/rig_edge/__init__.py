"""rig-edge: the vocabulary every rig device shares.

Openers (:class:`Opener`), memory kinds (:class:`Memory`), regions, DMA descriptions
(:class:`Dmabuf`, :class:`Bus`), a device's :class:`Facts`, the :class:`Driver` protocol and the
error policy (:mod:`rig_edge.errors`). No dependencies.

Thread safety: every rig function may be called from any thread at the same time as others;
each package keeps that with its own locks.
"""

from rig_edge.driver import Driver
from rig_edge.errors import Fault, Lost, Misuse, OpenRefused, OutOfMemory, RigError
from rig_edge.facts import Facts
from rig_edge.memory import Bus, Dmabuf, Memory, Refusal, Region
from rig_edge.opener import Opener, opener_name

__version__ = "0.1.0"

__all__ = [
    "Bus",
    "Dmabuf",
    "Driver",
    "Facts",
    "Fault",
    "Lost",
    "Memory",
    "Misuse",
    "OpenRefused",
    "Opener",
    "OutOfMemory",
    "Refusal",
    "Region",
    "RigError",
    "__version__",
    "opener_name",
]
