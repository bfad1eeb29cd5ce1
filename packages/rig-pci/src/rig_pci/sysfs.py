"""The sysfs transport: a machine reached through its /sys, /dev and /proc files under a root.

Root ``/`` is this machine (``Machine.this()``). Any other root is a tree laid out the same
way: a test's fixture (``rig_pci.testing``), or another machine's files mounted here. Every
path the transport touches is the machine's path under the root, so a fixture tree exercises
exactly the code that runs on this machine; only the ioctls (VFIO's) need a fake, which
:class:`rig_pci.vfio.Ioctl` makes replaceable.

A function is taken through VFIO when it is bound to vfio-pci, and physically when no driver
holds it and no IOMMU translates its accesses (:class:`PhysicalAccess`).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
from pathlib import Path

from rig_edge import RigError
from rig_pci.dma import DmaMemory, pagemap_ranges
from rig_pci.listing import (
    DEVICES,
    IORESOURCE_MEM,
    FunctionInfo,
    list_functions,
    parse_address,
    read_function,
)
from rig_pci.vfio import Ioctl, VfioAccess
from rig_pci.window import FileWindow, MappedWindow, Window, place

# Linux drivers/iommu/iommu.c: a group's sysfs "type"; "identity" passes bus addresses
# through untranslated (iommu=pt), so a function there can be taken physically.
IOMMU_IDENTITY = "identity"


class SysfsTransport:
    """The machine whose files lie under ``root``. ``shares_memory`` says whether this
    process's memory is the machine's (true only for this machine, root ``/``). ``ioctl``
    carries VFIO's ioctls (the real one unless a test gives a fake)."""

    def __init__(self, root: Path, *, shares_memory: bool, ioctl: Ioctl | None = None) -> None:
        self.root = root
        self._shares_memory = shares_memory
        self.ioctl = ioctl or Ioctl()

    @property
    def name(self) -> str:
        return "this machine" if self.root == Path("/") else f"the machine at {self.root}"

    @property
    def shares_memory(self) -> bool:
        return self._shares_memory

    def path(self, machine_path: str) -> Path:
        """The file that is ``machine_path`` (absolute, as the machine names it) here."""
        return self.root / machine_path.lstrip("/")

    def shown(self, path: Path) -> str:
        """``path`` as the machine names it, for messages."""
        try:
            return "/" + str(path.relative_to(self.root)).removeprefix(".")
        except ValueError:
            return str(path)

    def function_path(self, address: str) -> Path:
        """The sysfs directory of the function at ``address`` (/sys/bus/pci/devices/ADDRESS)."""
        parse_address(address)
        return self.root / DEVICES / address

    def functions(self) -> list[FunctionInfo]:
        return list_functions(self.root / DEVICES)

    def function(self, address: str) -> FunctionInfo:
        try:
            return read_function(self.function_path(address), address)
        except OSError as e:
            raise RigError(f"PCI function {address} cannot be read: {e.strerror}") from e

    def write(self, path: Path, text: str) -> None:
        """Write ``text`` to the sysfs file ``path`` in one ``write(2)``, as the kernel expects
        of its attribute files; raises :class:`OSError`. Every change rig makes to a machine's
        sysfs goes through here."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def iommu_translates(self, group: int) -> bool:
        """Whether IOMMU group ``group`` translates its functions' bus addresses (any type but
        ``identity``; a group whose type cannot be read is taken to translate)."""
        try:
            kind = (self.root / "sys/kernel/iommu_groups" / str(group) / "type").read_text()
        except OSError:
            return True
        return kind.strip() != IOMMU_IDENTITY

    def lockdown(self) -> str | None:
        """The kernel's lockdown mode ("integrity", "confidentiality") when it is locked
        down, else ``None`` (security/lockdown/lockdown.c shows the mode in brackets)."""
        try:
            text = (self.root / "sys/kernel/security/lockdown").read_text()
        except OSError:
            return None  # no lockdown LSM, or securityfs not mounted: nothing locks PCI down
        found = re.search(r"\[(\w+)\]", text)
        mode = found.group(1) if found else "none"
        return None if mode == "none" else mode

    def take(self, address: str) -> VfioAccess | PhysicalAccess:
        """Take ``address``: through VFIO when it is bound to vfio-pci, physically when no
        driver holds it and no IOMMU translates for it. Raises :class:`rig_edge.RigError`
        with the reason otherwise, or when its files cannot be opened."""
        info = self.function(address)
        if info.driver == "vfio-pci":
            if info.iommu_group is None:
                raise RigError("it is bound to vfio-pci but lies in no IOMMU group")
            return VfioAccess(self.root, address, info.iommu_group, self.ioctl)
        if info.driver is not None:
            raise RigError(f"the kernel driver {info.driver} holds it (detach it first)")
        group = info.iommu_group
        if group is not None and self.iommu_translates(group):
            raise RigError(
                f"it lies behind an IOMMU (group {group}): bind it to vfio-pci and grant "
                f"access to /dev/vfio/{group} to take it"
            )
        return PhysicalAccess(self, info)


def _open(transport: SysfsTransport, path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError as e:
        raise RigError(f"{transport.shown(path)} cannot be opened: {e.strerror}") from e


class PhysicalAccess:
    """A function this process holds with no IOMMU between it and memory: its sysfs config
    and resource files, open for reading and writing, and an exclusive ``flock`` on its config
    file, which any other rig take (in this process or another) respects."""

    how = "physically"
    maps_host = False
    dma_granule = 2 << 20  # a huge page (libc.HUGE_PAGE)

    def __init__(self, transport: SysfsTransport, info: FunctionInfo) -> None:
        """Open the function's files; raises :class:`rig_edge.RigError` with the reason (the
        kernel is locked down, /proc/self/pagemap is unreadable, a file cannot be opened,
        another holder has the function), having kept nothing open."""
        self._t = transport
        self._info = info
        self._dir = transport.function_path(info.address)
        self._fds: dict[str, int] = {}
        self._config: FileWindow | None = None
        self._pagemap: Path | None = None
        try:
            self._take()
        except BaseException:
            self.close()
            raise

    def _take(self) -> None:
        t = self._t
        mode = t.lockdown()
        if mode is not None:
            raise RigError(
                f"the kernel is locked down ({mode}), which refuses PCI mappings from user space"
            )
        if t.shares_memory:
            pagemap = t.path("/proc/self/pagemap")
            os.close(_open(t, pagemap, os.O_RDONLY))
            self._pagemap = pagemap
        config = _open(t, self._dir / "config", os.O_RDWR)
        self._fds["config"] = config
        try:
            fcntl.flock(config, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RigError("another holder (a process, or a take in this one) has it") from e
            raise RigError(f"its config file cannot be locked: {e.strerror}") from e
        for bar in self._info.bars:
            if bar.flags & IORESOURCE_MEM:
                name = f"resource{bar.index}"
                self._fds[name] = _open(t, self._dir / name, os.O_RDWR)
        self._config = FileWindow(
            config, 0, os.fstat(config).st_size or 256, f"{self._info.address} config space"
        )

    @property
    def can_reset(self) -> bool:
        return (self._dir / "reset").exists()

    def config(self) -> Window:
        assert self._config is not None
        return self._config

    def window(self, bar: int, offset: int, length: int, write_combined: bool,
               at: int | None = None) -> Window:
        name = f"resource{bar}"
        if write_combined and (self._dir / f"{name}_wc").exists():  # prefetchable BARs only
            name += "_wc"
        if name not in self._fds:
            self._fds[name] = _open(self._t, self._dir / name, os.O_RDWR)
        if at is not None:  # the resource file mapped as Python's mmap maps it, but at `at`
            return place(self._fds[name], offset, length, at,
                         f"{self._info.address} BAR {bar} ({self._t.shown(self._dir / name)})")
        try:
            m = mmap.mmap(self._fds[name], length, offset=offset)
        except OSError as e:
            raise RigError(f"{self._t.shown(self._dir / name)} cannot be mapped: {e}") from e
        return MappedWindow(m, f"{self._info.address} BAR {bar}")

    def reset(self) -> None:
        path = self._dir / "reset"
        try:
            self._t.write(path, "1")
        except OSError as e:
            raise RigError(f"writing {self._t.shown(path)} failed: {e.strerror}") from e

    def alloc_dma(self, n: int, at: int | None) -> DmaMemory | None:
        from rig_pci import libc

        flags = (
            libc.MAP_PRIVATE
            | libc.MAP_ANONYMOUS
            | libc.MAP_HUGETLB
            | libc.MAP_HUGE_2MB
            | libc.MAP_POPULATE
            | (libc.MAP_FIXED if at is not None else 0)
        )

        def give_back(host: int) -> None:
            if at is None:
                libc.munmap(host, n)
            else:
                libc.reserve(at, n)  # a failed MAP_FIXED may have unmapped the reservation

        try:
            host = libc.mmap(at or 0, n, libc.PROT_READ | libc.PROT_WRITE, flags)
        except OSError as e:
            if at is not None:
                give_back(at)
            if e.errno == errno.ENOMEM:  # no free huge page (vm.nr_hugepages)
                return None
            raise RigError(f"mmap of {n} bytes of 2 MiB huge pages failed: {e.strerror}") from e
        try:
            if self._pagemap is None:
                raise RigError("the machine's memory is not this process's")
            bus = pagemap_ranges(self._pagemap, host, n, self.dma_granule, libc.PAGE)
        except BaseException:
            give_back(host)
            raise
        return DmaMemory(host, n, bus, lambda: give_back(host))

    def map_host(self, address: int, length: int) -> DmaMemory | None:
        raise RigError(
            "taken physically, it cannot be given the process's own memory (maps_host is "
            "false: the pages would go back to the system at the process's death)"
        )

    def close(self) -> None:
        if self._config is not None:
            self._config.close()
        while self._fds:
            _name, fd = self._fds.popitem()
            os.close(fd)
