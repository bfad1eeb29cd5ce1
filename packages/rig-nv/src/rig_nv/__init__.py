"""rig-nv: an NVIDIA GPU over an abstract resource-manager (RM) path.

Both paths (the kernel driver's ioctls, the GSP's queues) speak one RM interface; everything
above it (address space, memory, channels, copies, launches, the timeline) is written here once.
"""

from rig_nv.classes import Classes
from rig_nv.clock import Clock
from rig_nv.cubin import CubinError, UnknownKernel
from rig_nv.device import Device, Point, make
from rig_nv.launch import Function, Image
from rig_nv.pci import NVIDIA, PciIdentity, is_gpu
from rig_nv.profile import Event, Profile
from rig_nv.queues import Queue
from rig_nv.rm import RM, Allocation, Path, RMError
from rig_nv.step import Step
from rig_nv.tensormap import TensorMap, TensorMapError, tensor_map, tensor_map_im2col

__version__ = "0.1.0"

__all__ = [
    "NVIDIA",
    "RM",
    "Allocation",
    "Classes",
    "Clock",
    "CubinError",
    "Device",
    "Event",
    "Function",
    "Image",
    "Path",
    "PciIdentity",
    "Point",
    "Profile",
    "Queue",
    "RMError",
    "Step",
    "TensorMap",
    "TensorMapError",
    "UnknownKernel",
    "__version__",
    "is_gpu",
    "make",
    "tensor_map",
    "tensor_map_im2col",
]
