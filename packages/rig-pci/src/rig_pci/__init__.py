"""rig-pci: a machine's PCI functions, with nothing NVIDIA in it.

:class:`Machine` lists the functions of this machine (``Machine.this()``) or of a sysfs tree
elsewhere (``Machine.at(path)``), in bus order, with their BARs, bound driver, IOMMU group
and runtime power state.
"""

from rig_pci.machine import Bar, FunctionInfo, Machine, parse_address

__version__ = "0.1.0"

__all__ = ["Bar", "FunctionInfo", "Machine", "__version__", "parse_address"]
