"""rig-nv-pci: NVIDIA GPUs driven over PCI with no kernel driver (the ``Rig_nv_pci`` spec).

Its layers, each importing only those below it (tests/test_layers.py checks for circles):

- :mod:`rig_nv_pci.firmware`: NVIDIA's firmware images, the VBIOS, the FB layout, the chips;
- :mod:`rig_nv_pci.boot`: the falcons, the Ampere/Ada and Blackwell boots, the GSP's memory,
  the stop;
- :mod:`rig_nv_pci.gsp`: the GSP's queues, RPCs, events, sequencer and static info;
- :mod:`rig_nv_pci.path`: the RM path over the GSP (address space, video memory, channels);
- :mod:`rig_nv_pci.held` (the open once its preconditions passed) and
  :mod:`rig_nv_pci.opener` (the opener, its preconditions, detach, attach and reset).
"""

from rig_nv_pci.opener import (
    NOT_BUILT,
    PATH,
    __version__,
    attach,
    buses,
    count,
    detach,
    gpu,
    reset,
)

__all__ = [
    "NOT_BUILT",
    "PATH",
    "__version__",
    "attach",
    "buses",
    "count",
    "detach",
    "gpu",
    "reset",
]
