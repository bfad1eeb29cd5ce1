"""A machine: the PCI functions a transport reaches.

``Machine.this()`` is this machine, through its own sysfs; ``Machine.at(path)`` a machine whose
sysfs tree lies under ``path`` (a fixture, or another machine's files mounted here); and
``Machine.ssh(destination)`` another machine, through rig's agent over OpenSSH's ``ssh``
(:mod:`rig_pci.ssh`); and ``Machine(transport)`` a machine reached through any
:class:`rig_pci.transport.Transport`. What needs this process's memory (DMA memory) is refused
on every machine but this one. A machine with a connection keeps it until :meth:`close`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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

    @classmethod
    def ssh(cls, destination: str, *, port: int | None = None,
            options: Sequence[str] = (), root: str = "/", timeout_s: float = 30.0) -> Machine:
        """The machine ``destination`` (``[user@]host``, or a host of ~/.ssh/config) reached by
        OpenSSH's ``ssh``, on ``port`` if given, with ``options`` (more of ssh's arguments,
        such as ``["-i", key]``: they come before rig's own, and ssh keeps the first value of
        each option), whose sysfs tree lies under ``root`` there (``/``; another directory
        for a tree standing for a machine, as ``Machine.at``). Nothing is installed there:
        rig's agent is sent to its python3 (Python 3.11 or later) over the connection, which
        the first call starts and every call then shares, from any thread, until
        :meth:`close`. ``timeout_s`` bounds the start and each
        call.

        Listing, config space, BAR registers, reset and the locks of rig_nv_pci go there; what
        needs the process's memory (DMA, an open) is refused. Each failure raises
        :class:`rig_edge.RigError` naming the machine and the cause (:mod:`rig_pci.ssh`).
        Raises :class:`rig_edge.Misuse` for a destination starting with ``-``, a port outside
        1-65535 or options given as one string."""
        from rig_pci.ssh import SshTransport

        return cls(SshTransport(destination, port=port, options=options, root=str(root),
                                timeout_s=timeout_s))

    def close(self) -> None:
        """Close the machine's connection, where it has one (this machine and sysfs trees have
        none); what was taken through it is let go there. Again does nothing."""
        close = getattr(self.transport, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> Machine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
