"""Detaching a function from its kernel driver, and attaching it back, through sysfs.

Every change is a write to the machine's /sys/bus/pci files (Documentation/ABI/testing/
sysfs-bus-pci): ``driver_override`` names the only driver that may bind the function ("none"
for no driver), ``drivers/NAME/unbind`` takes it from its driver, ``drivers_probe`` has the
kernel bind it again. They need CAP_SYS_ADMIN and write access to those files, which root has,
and act on a machine reached through its sysfs (this one, or a fixture tree under a
directory); another machine's drivers need a program there.

:func:`detach` raises only before its first write; after it, it answers what it managed: a
:class:`Detached`, or a :class:`PartWay` saying why it stopped. Its changes persist after the
process. :func:`attach` resets the function first, clears the override and reprobes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from rig_edge import RigError
from rig_pci.function import RESET_TIMEOUT_S, Function, held
from rig_pci.listing import FunctionInfo, link_name
from rig_pci.machine import Machine
from rig_pci.sysfs import SysfsTransport

# After how many milliseconds without progress rig gives up the work of a device that no
# kernel driver's watchdog watches (the spec's Rig_pci.Driver.hang_ms).
hang_ms = 30_000

NO_DRIVER = "none"  # an override no driver has: sysfs-bus-pci's way to keep every driver off
VFIO_PCI = "vfio-pci"


@dataclass(frozen=True)
class Detached:
    """The function is detached: no kernel driver but the one asked for holds it, and the
    override keeps every other off it."""


@dataclass(frozen=True)
class PartWay:
    """A detach wrote to the machine but stopped part way; ``why`` says where and why."""

    why: str


Progress: TypeAlias = Detached | PartWay


def _override(t: SysfsTransport, info: FunctionInfo) -> str | None:
    """The function's driver_override, ``None`` where none is set (the kernel shows
    "(null)")."""
    path = t.function_path(info.address) / "driver_override"
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise RigError(f"{t.shown(path)} cannot be read: {e.strerror}") from e
    return None if text in ("", "(null)") else text


def _bound_wanted(driver: str) -> str | None:
    """The driver a detach that leaves the function to ``driver`` binds it to, if any."""
    return None if driver == NO_DRIVER else driver


def _writable(t: SysfsTransport, paths: Iterable[Path]) -> None:
    for path in paths:
        if not os.access(path, os.W_OK):
            raise RigError(
                f"{t.shown(path)} is not writable (detach and attach need root's "
                "CAP_SYS_ADMIN and write access to /sys/bus/pci)"
            )


def _machine_path(t: SysfsTransport, path: Path) -> str:
    """``path``, with its links resolved, as the machine names it."""
    real = Path(os.path.realpath(path))
    return "/" + str(real.relative_to(os.path.realpath(t.root))).removeprefix(".")


def _drm_nodes(t: SysfsTransport, address: str) -> list[str]:
    """The DRM nodes (card0, renderD128) a DRM driver made for the function."""
    try:
        return sorted(os.listdir(t.function_path(address) / "drm"))
    except OSError:
        return []


def _comm(proc: Path, pid: str) -> str:
    try:
        return (proc / pid / "comm").read_text().strip()
    except OSError:
        return "?"


def holders(t: SysfsTransport, files: set[str], under: str) -> list[str]:
    """Who holds one of ``files`` (machine paths), or a file below the directory ``under``,
    open or mapped: "process PID (COMMAND) holds PATH", read from /proc/PID/fd and
    /proc/PID/maps. Raises :class:`rig_edge.RigError` when a process's files cannot be seen
    (not root)."""

    def wanted(path: str) -> bool:
        return path in files or path.startswith(under + "/")

    proc = t.path("/proc")
    try:
        pids = sorted((p for p in os.listdir(proc) if p.isdigit()), key=int)
    except OSError as e:
        raise RigError(f"/proc cannot be listed: {e.strerror}") from e
    found = []
    for pid in pids:
        held_here: set[str] = set()
        try:
            fds = proc / pid / "fd"
            for fd in os.listdir(fds):
                try:
                    target = os.readlink(fds / fd)
                except FileNotFoundError:
                    continue  # closed meanwhile
                if wanted(target):
                    held_here.add(target)
            for line in (proc / pid / "maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and wanted(fields[5]):
                    held_here.add(fields[5])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process ended
        except PermissionError as e:
            raise RigError(
                f"the files process {pid} holds cannot be seen ({e.strerror}): run as root"
            ) from e
        found += [f"process {pid} ({_comm(proc, pid)}) holds {f}" for f in sorted(held_here)]
    return found


def _drm_clients(t: SysfsTransport, address: str, nodes: list[str]) -> list[str]:
    """The DRM driver's clients of the function, from debugfs's dri/MINOR/clients (which also
    shows clients that hold no file, such as a display server's leases); raises
    :class:`rig_edge.RigError` when debugfs is not mounted at /sys/kernel/debug."""
    dri = t.path("/sys/kernel/debug/dri")
    if not dri.is_dir():
        raise RigError(
            f"{address} has DRM nodes ({', '.join(nodes)}), whose clients only debugfs lists: "
            "mount debugfs at /sys/kernel/debug"
        )
    out = []
    for node in nodes:
        minor = node.removeprefix("card").removeprefix("renderD")
        try:
            lines = (dri / minor / "clients").read_text().splitlines()
        except OSError:
            continue
        # drivers/gpu/drm/drm_debugfs.c: a header, then "command tgid dev master a uid magic".
        for line in lines[1:]:
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                out.append(f"process {fields[1]} ({fields[0]}) is a client of {node}")
    return out


def _refuse_held(t: SysfsTransport, info: FunctionInfo, device_files: Iterable[str]) -> None:
    nodes = _drm_nodes(t, info.address)
    files = {*device_files, *(f"/dev/dri/{n}" for n in nodes)}
    if info.iommu_group is not None:
        files.add(f"/dev/vfio/{info.iommu_group}")
    found = holders(t, files, _machine_path(t, t.function_path(info.address)))
    if nodes:
        found += _drm_clients(t, info.address, nodes)
    if found:
        raise RigError(f"{info.address} is in use: {'; '.join(found)}")


def detach(
    machine: Machine,
    bus: str,
    *,
    device_files: Iterable[str] = (),
    driver: str | None = None,
) -> Progress:
    """Detach the function at ``bus`` of ``machine`` from its kernel driver, so it can be
    taken, unless it is detached already.

    ``driver`` is the driver to leave it to: by default vfio-pci when an IOMMU translates for
    the function (so it is taken through VFIO), else none (taken physically). The function's
    ``driver_override`` is set to it, the function is unbound from its driver, and, for
    vfio-pci, the kernel reprobes it. The kernel driver's users lose the function until
    :func:`attach` or a reboot.

    Raises :class:`rig_edge.RigError`, having written nothing, if the machine is not reached
    through sysfs, the function cannot be read, this process holds it, a process holds its
    files (its sysfs files, its IOMMU group's /dev/vfio/N, its DRM nodes, or any of
    ``device_files``, machine paths such as /dev/nvidia0) open or mapped, naming the process,
    a DRM driver holds it and debugfs is not mounted at /sys/kernel/debug, the driver to leave
    it to is not loaded, or the files to write are not writable. After its first write it
    answers :class:`Detached` or :class:`PartWay`.
    """
    t = machine.sysfs
    info = t.function(bus)
    if held(machine, bus):
        raise RigError(f"{bus} cannot be detached: this process holds it")
    if driver is None:
        group = info.iommu_group
        driver = VFIO_PCI if group is not None and t.iommu_translates(group) else NO_DRIVER
    bound_wanted = _bound_wanted(driver)
    override = _override(t, info)
    if info.driver == bound_wanted and override == driver:
        return Detached()
    where = t.function_path(bus)
    drivers = t.path("/sys/bus/pci/drivers")
    probe = t.path("/sys/bus/pci/drivers_probe")
    to_write = [where / "driver_override"]
    if info.driver is not None and info.driver != bound_wanted:
        to_write.append(drivers / info.driver / "unbind")
    if bound_wanted is not None and info.driver != bound_wanted:
        if not (drivers / bound_wanted).is_dir():
            raise RigError(f"{bus} cannot be detached: {bound_wanted} is not loaded")
        to_write.append(probe)
    _writable(t, to_write)
    _refuse_held(t, info, device_files)

    try:
        t.write(where / "driver_override", driver + "\n")
    except OSError as e:  # the first write changed nothing
        raise RigError(f"{bus} cannot be detached: writing its driver_override: {e}") from e
    try:
        return _after_override(t, info, driver)
    except OSError as e:  # its driver link unreadable, say: the machine is changed already
        return PartWay(f"its override is {driver}, but what holds it cannot be read: {e}")


def _after_override(t: SysfsTransport, info: FunctionInfo, driver: str) -> Progress:
    """The rest of :func:`detach` once the override is written: unbind, then probe for the
    driver asked for. Raises :class:`OSError` where a driver link cannot be read."""
    bus, where, bound_wanted = info.address, t.function_path(info.address), _bound_wanted(driver)
    drivers, probe = t.path("/sys/bus/pci/drivers"), t.path("/sys/bus/pci/drivers_probe")
    if info.driver is not None and info.driver != bound_wanted:
        try:
            t.write(drivers / info.driver / "unbind", bus)
        except OSError as e:
            return PartWay(f"its override is {driver}, but {info.driver} did not let it go: {e}")
        if link_name(where / "driver") is not None:
            return PartWay(f"its override is {driver}, but {info.driver} still holds it")
    if bound_wanted is not None and link_name(where / "driver") != bound_wanted:
        try:
            t.write(probe, bus)
        except OSError as e:
            return PartWay(f"it is unbound, but probing it for {bound_wanted} failed: {e}")
        now = link_name(where / "driver")
        if now != bound_wanted:
            return PartWay(f"it is unbound, but {bound_wanted} did not bind it (bound: {now})")
    return Detached()


def attach(
    machine: Machine,
    bus: str,
    *,
    after_reset: Callable[[Function], None] | None = None,
    timeout_s: float = RESET_TIMEOUT_S,
) -> None:
    """Give the function at ``bus`` of ``machine`` back to its kernel driver.

    Unless a kernel driver other than vfio-pci has it, it is reset first as
    :meth:`rig_pci.Function.reset` does (``after_reset``, given the function still held,
    may check what the reset left and raise to stop the attach); then vfio-pci lets it go,
    its ``driver_override`` is cleared and the kernel reprobes it. A function a driver holds
    with no override is attached already and nothing is written.

    Raises :class:`rig_edge.RigError` if the machine is not reached through sysfs, the
    function cannot be read, this process holds it, it cannot be taken or reset, a file
    cannot be written, or no kernel driver binds it after the probe; where its reset was
    attempted and failed (or the function did not answer after it), that error is
    :class:`rig_pci.function.ResetFailed`, so a caller can tell a function the attach may
    have left in any state from one it did not touch (Linux has no reset for it, it could
    not be taken: plain RigErrors).
    """
    t = machine.sysfs
    info = t.function(bus)
    if held(machine, bus):
        raise RigError(f"{bus} cannot be attached: this process holds it")
    override = _override(t, info)
    if info.driver not in (None, VFIO_PCI) and override is None:
        return
    where = t.function_path(bus)
    probe = t.path("/sys/bus/pci/drivers_probe")
    steps: list[tuple[Path, str]] = []
    if info.driver == VFIO_PCI:
        steps.append((t.path(f"/sys/bus/pci/drivers/{VFIO_PCI}/unbind"), bus))
    steps += [(where / "driver_override", "\n"), (probe, bus)]
    _writable(t, [path for path, _text in steps])
    if info.driver in (None, VFIO_PCI):
        with Function.take(machine, bus) as f:
            f.reset(timeout_s)
            if after_reset is not None:
                after_reset(f)
    for path, text in steps:
        try:
            t.write(path, text)
        except OSError as e:
            raise RigError(f"{bus} cannot be attached: writing {t.shown(path)}: {e}") from e
    now = link_name(where / "driver")
    if now in (None, VFIO_PCI):
        raise RigError(
            f"{bus} cannot be attached: no kernel driver bound it after the probe "
            "(is its driver's module loaded?)"
        )
