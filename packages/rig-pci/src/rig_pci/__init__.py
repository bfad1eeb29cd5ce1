"""rig-pci: a machine's PCI functions, with nothing NVIDIA in it.

:class:`Machine` lists the functions of this machine (``Machine.this()``), of a sysfs tree
elsewhere (``Machine.at(path)``), of another machine over SSH (``Machine.ssh(host)``,
:mod:`rig_pci.ssh`) or of a machine behind any :class:`Transport`, in bus order, with their
BARs, bound driver, IOMMU group and runtime power state.
:meth:`Function.take` takes one for the process (through VFIO behind an IOMMU, else
physically): config space and BAR :class:`Window` s with exact-width register access (a BAR
window placed at an address the caller reserved with ``at``), DMA memory
(:meth:`Function.alloc_dma`) and reset. :mod:`rig_pci.driver` detaches a function from
its kernel driver and attaches it back; :mod:`rig_pci.firmware` finds firmware files by
digest; :mod:`rig_pci.memory` tells the bus ranges of BARs and DMA memory and whether two
functions reach each other; :mod:`rig_pci.testing` writes fixture machines.
"""

import importlib
from typing import TYPE_CHECKING, Any

from rig_pci.dma import DmaMemory
from rig_pci.listing import Bar, FunctionInfo, parse_address
from rig_pci.machine import Machine
from rig_pci.transport import Access, Transport
from rig_pci.window import Window

if TYPE_CHECKING:
    from rig_pci import driver, firmware, memory
    from rig_pci.function import Function

# Imported on first use (PEP 562), so that a listing (`rig list`, which must start within
# 150 ms) does not pay for taking, detaching and firmware digests it never uses.
_LAZY = {"driver": "rig_pci.driver", "firmware": "rig_pci.firmware",
         "memory": "rig_pci.memory", "Function": "rig_pci.function"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rig_pci' has no attribute {name!r}")
    value = importlib.import_module(module)
    if name == "Function":
        value = value.Function
    globals()[name] = value
    return value

__version__ = "0.1.0"

__all__ = [
    "Access",
    "Bar",
    "DmaMemory",
    "Function",
    "FunctionInfo",
    "Machine",
    "Transport",
    "Window",
    "__version__",
    "driver",
    "firmware",
    "memory",
    "parse_address",
]
