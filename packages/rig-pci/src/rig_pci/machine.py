"""A machine: the PCI functions a transport reaches.

``Machine.this()`` is this machine, through its own sysfs; ``Machine.at(path)`` a machine whose
sysfs tree lies under ``path`` (a fixture, or another machine's files mounted here); and
``Machine(transport)`` a machine reached through any :class:`rig_pci.transport.Transport`.
What needs this process's memory (DMA memory) is refused on every machine but this one.
"""

from __future__ import annotations

import os
from pathlib import Path

from rig_edge import RigError
from rig_pci.listing import FunctionInfo
from rig_pci.sysfs import SysfsTransport
from rig_pci.transport import Transport
from rig_pci.vfio import Ioctl


class Machine:
    """A machine whose PCI functions are reached through ``transport``."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @classmethod
    def this(cls) -> Machine:
        """This machine, through /sys, /dev and /proc."""
        return cls(SysfsTransport(Path("/"), shares_memory=True))

    @classmethod
    def at(cls, root: str | os.PathLike[str], *, ioctl: Ioctl | None = None) -> Machine:
        """A machine whose sysfs (and /dev, /proc) tree lies under ``root``: a fixture, or
        another mount. Its memory is not this process's. ``ioctl`` replaces VFIO's ioctls
        (tests give a fake kernel)."""
        return cls(SysfsTransport(Path(root), shares_memory=False, ioctl=ioctl))

    def __repr__(self) -> str:
        return f"Machine({self.name})"

    @property
    def name(self) -> str:
        """The machine, for messages (``"this machine"``, ``"the machine at /tmp/x"``)."""
        return self.transport.name

    @property
    def is_this(self) -> bool:
        """Whether this process's memory is the machine's, so its functions reach it by DMA."""
        return self.transport.shares_memory

    @property
    def sysfs(self) -> SysfsTransport:
        """The machine's sysfs transport, for what writes its sysfs files (driver detach and
        attach); raises :class:`rig_edge.RigError` for a machine reached another way, whose
        changes need a program there."""
        if isinstance(self.transport, SysfsTransport):
            return self.transport
        raise RigError(
            f"{self.name} is reached through a transport: changing its drivers needs a "
            "program there"
        )

    def functions(self) -> list[FunctionInfo]:
        """The machine's PCI functions in bus order (domain, bus, device, function, as numbers).

        A machine with no /sys/bus/pci lists none. A function whose files cannot be read (the
        kernel removing it, say) is left out. Raises :class:`rig_edge.RigError` with the reason
        when the listing itself cannot be made (no file left to open, no permission).
        """
        return self.transport.functions()

    def function(self, address: str) -> FunctionInfo:
        """The function at ``address``; raises :class:`rig_edge.RigError` if it can't be read
        and :class:`rig_edge.Misuse` if ``address`` is no bus address."""
        return self.transport.function(address)
