"""rig-nv: an NVIDIA GPU over an abstract resource-manager (RM) path.

Both paths (the kernel driver's ioctls, the GSP's queues) speak one RM interface; everything
above it (address space, memory, channels, copies, launches, the timeline) is written here once.
"""

from rig_nv.classes import Classes
from rig_nv.clock import Clock
from rig_nv.device import Device, Point, make
from rig_nv.pci import NVIDIA, PciIdentity, is_gpu
from rig_nv.queues import Queue
from rig_nv.rm import RM, Allocation, Path, RMError

__version__ = "0.1.0"

__all__ = [
    "NVIDIA",
    "RM",
    "Allocation",
    "Classes",
    "Clock",
    "Device",
    "Path",
    "PciIdentity",
    "Point",
    "Queue",
    "RMError",
    "__version__",
    "is_gpu",
    "make",
]
