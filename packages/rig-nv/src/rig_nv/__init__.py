"""rig-nv: an NVIDIA GPU over an abstract resource-manager (RM) path.

Both paths (the kernel driver's ioctls, the GSP's queues) speak one RM interface; everything
above it (address space, memory, channels, copies, launches, the timeline) is written here once.
"""

from rig_nv.pci import NVIDIA, PciIdentity, is_gpu

__version__ = "0.1.0"

__all__ = ["NVIDIA", "PciIdentity", "__version__", "is_gpu"]
