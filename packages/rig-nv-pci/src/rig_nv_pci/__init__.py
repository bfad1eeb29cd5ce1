"""rig-nv-pci: NVIDIA GPUs driven over PCI with no kernel driver.

The process takes the GPU's PCI function, boots its GSP with NVIDIA's signed firmware and acts
as the kernel half of the resource manager. This release lists GPUs; the boot is built against
a simulated GPU (see the package README).
"""

from __future__ import annotations

from rig_nv import is_gpu
from rig_pci import Machine

__version__ = "0.1.0"


def buses(machine: Machine | None = None) -> list[str]:
    """The bus addresses of ``machine``'s NVIDIA GPUs (this machine by default), in bus order.

    ``[]`` where the machine lists no PCI functions. Raises :class:`rig_edge.RigError` if its
    functions cannot be listed. Changes nothing on the machine.
    """
    return [f.address for f in (machine or Machine.this()).functions() if is_gpu(f)]


def count(machine: Machine | None = None) -> int:
    """The number of ``machine``'s NVIDIA GPUs; raises as :func:`buses`."""
    return len(buses(machine))


__all__ = ["__version__", "buses", "count"]
