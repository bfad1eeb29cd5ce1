"""The machine's NVIDIA GPUs, as this path numbers them."""

from __future__ import annotations

from rig_nv import is_gpu
from rig_pci import FunctionInfo, Machine


def gpu_functions(machine: Machine | None = None) -> list[FunctionInfo]:
    """The NVIDIA GPUs of ``machine`` (this one by default) in bus order."""
    return [f for f in (machine or Machine.this()).functions() if is_gpu(f)]


def buses() -> list[str]:
    """The bus addresses of this machine's NVIDIA GPUs, in bus order: GPU i is the ith.

    ``[]`` where /sys/bus/pci does not exist. Raises :class:`rig_edge.RigError` if the
    machine's PCI functions cannot be listed. Changes nothing on the machine.
    """
    return [f.address for f in gpu_functions()]


def count() -> int:
    """The number of NVIDIA GPUs (0 on a machine with none); raises as :func:`buses`."""
    return len(buses())
