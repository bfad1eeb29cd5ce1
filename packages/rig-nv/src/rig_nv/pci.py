"""Which PCI functions are NVIDIA GPUs.

rig-nv depends on rig-edge alone, so it takes any listing entry with ``vendor`` and
``class_code`` (rig-pci's :class:`rig_pci.FunctionInfo` is one).
"""

from __future__ import annotations

from typing import Protocol

NVIDIA = 0x10DE
# PCI class codes (PCI Code and ID Assignment spec): 0x0300 VGA controller, 0x0302 3D controller.
GPU_CLASSES = (0x0300, 0x0302)


class PciIdentity(Protocol):
    """What :func:`is_gpu` reads of a PCI function."""

    @property
    def vendor(self) -> int:
        """The PCI vendor id (0x10de for NVIDIA)."""
        ...

    @property
    def class_code(self) -> int:
        """The 24-bit PCI class code (0x030000 for a VGA controller)."""
        ...


def is_gpu(function: PciIdentity) -> bool:
    """Whether ``function`` is an NVIDIA GPU (not its audio or USB functions)."""
    return function.vendor == NVIDIA and (function.class_code >> 8) in GPU_CLASSES
