"""rig-nv-pci: NVIDIA GPUs driven over PCI with no kernel driver.

The process takes the GPU's PCI function, boots its GSP with NVIDIA's signed firmware and acts
as the kernel half of the resource manager (the ``Rig_nv_pci`` spec).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/opener.md."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from rig_edge import Misuse, Opener, OpenRefused, RigError, opener_name
from rig_nv import Device, is_gpu
from rig_nv_pci import held, lock
from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.firmware import chips
from rig_pci import Function, FunctionInfo, Machine, Window, driver, firmware
from rig_pci.function import ResetFailed
from rig_pci.function import held as function_held

__version__ = "0.1.0"

PATH = "NV-PCI"
NOT_BUILT = "the GSP boot is not built in this release"
VFIO_PCI = "vfio-pci"
BAR0_PAGE = 0x1000


def buses(machine: Machine | None = None) -> list[str]:
    """The bus addresses of ``machine``'s NVIDIA GPUs (this machine by default), in bus order:
    GPU i is the ith.

    ``[]`` where the machine lists no PCI functions. Raises :class:`rig_edge.RigError` if its
    functions cannot be listed. Changes nothing on the machine.
    """
    return [f.address for f in (machine or Machine.this()).functions() if is_gpu(f)]


def count(machine: Machine | None = None) -> int:
    """The number of ``machine``'s NVIDIA GPUs; raises as :func:`buses`."""
    return len(buses(machine))


# ---- naming ------------------------------------------------------------------------------------


def _name(i: int, machine: Machine, bus: str | None = None) -> str:
    """The GPU, for messages: ``"GPU 0 (0000:01:00.0)"``, ``"GPU 1 of the machine at /x"``."""
    where = "" if machine.name == "this machine" else f" of {machine.name}"
    return f"GPU {i}{where}" + (f" ({bus})" if bus else "")


def _take(machine: Machine, bus: str, name: str) -> Function:
    """Take GPU ``name``'s function, or say (naming the GPU) why it cannot be taken."""
    try:
        return Function.take(machine, bus)
    except RigError as e:
        why = e.__cause__ if isinstance(e.__cause__, RigError) else _reason(e, bus)
        raise RigError(f"{name}: its function cannot be taken: {why}") from e


def _reason(e: BaseException, bus: str) -> str:
    """``e``'s message with the bus address it starts with put as "it", so that the GPU's
    name before it does not say the address twice."""
    text = str(e)
    if text.startswith(bus + ": "):
        return text[len(bus) + 2 :]
    if text.startswith(bus + " "):
        return "it " + text[len(bus) + 1 :]
    return text


def _index(i: int) -> None:
    """Misuse for an index that is no int (a bool is none) or is negative: rig_edge's rule."""
    opener_name(PATH, i)


def _function(machine: Machine, i: int) -> FunctionInfo:
    """GPU ``i`` of ``machine``; raises :class:`rig_edge.RigError` naming it when the machine
    cannot be listed or has no GPU i."""
    try:
        gpus = [f for f in machine.functions() if is_gpu(f)]
    except RigError as e:
        why = str(e).removeprefix("the machine's PCI functions cannot be listed: ")
        raise RigError(
            f"{_name(i, machine)}: {machine.name}'s PCI functions cannot be listed: {why}"
        ) from e
    if i >= len(gpus):
        raise RigError(f"{_name(i, machine)}: {machine.name} has no GPU {i} (it has {len(gpus)})")
    return gpus[i]


def _not_held(machine: Machine, bus: str, name: str) -> None:
    if (machine.name, bus) in _kept:
        raise RigError(f"{name}: {KEPT}")
    if function_held(machine, bus) or lock.held(machine, bus):
        raise RigError(f"{name}: this process holds it (an open of it, or its function taken)")


def _lock(machine: Machine, bus: str, name: str) -> lock.BusLock:
    try:
        return lock.BusLock.take(machine, bus)
    except RigError as e:
        raise RigError(f"{name}: {e}") from e


# ---- registers ---------------------------------------------------------------------------------


def _read(f: Function, offset: int) -> int:
    """The 32-bit register at BAR 0 ``offset``, through a one-page window."""
    page = offset - offset % BAR0_PAGE
    try:
        w: Window = f.window(0, page, BAR0_PAGE)
    except Misuse as e:
        raise RigError(f"its BAR 0 does not reach register 0x{offset:x}: {e}") from e
    try:
        return w.read32(offset - page)
    finally:
        w.close()


def _boot42(f: Function) -> int:
    value = _read(f, chips.NV_PMC_BOOT_42)
    if value == 0xFFFFFFFF:
        status = f.info.runtime_status or "unknown"
        raise RigError(
            f"it does not answer: NV_PMC_BOOT_42 reads 0xffffffff (its runtime power state "
            f"is {status})"
        )
    return value


def _wpr2_up(f: Function) -> int | None:
    """NV_PFB_PRI_MMU_WPR2_ADDR_HI when it says WPR2 is up, else ``None``. Read on Turing and
    later chips (BOOT_42's architecture 0x16 up), which have the register; earlier ones have
    no WPR2 this library could have left up."""
    if chips.field(_boot42(f), chips.NV_PMC_BOOT_42_ARCHITECTURE) < 0x16:
        return None
    value = _read(f, chips.NV_PFB_PRI_MMU_WPR2_ADDR_HI)
    return value if chips.wpr2_up(value) else None


def _wpr2_down_after_reset(f: Function) -> None:
    """Raise :class:`rig_edge.RigError` if WPR2 is still up after a reset (the spec: a reset
    that leaves WPR2 up fails)."""
    value = _wpr2_up(f)
    if value is not None:
        raise RigError(
            f"its protected memory (WPR2) is still up after its reset "
            f"(NV_PFB_PRI_MMU_WPR2_ADDR_HI reads 0x{value:08x})"
        )


# ---- the opener --------------------------------------------------------------------------------


def _fwsec(f: Function) -> None:
    """Raise :class:`rig_edge.RigError` saying what the VBIOS lacks if it has no FWSEC this
    library runs (an Ampere or Ada boot runs FWSEC-FRTS; read through the PROM window, before
    anything changes on the GPU)."""
    w = f.window(0)
    try:
        boot.read_vbios(w)
    except boot.BootError as e:
        raise RigError(str(e)) from e
    finally:
        w.close()


def _firmware(
    chip: chips.Chip, dirs: Sequence[str | os.PathLike[str]]
) -> dict[str, os.PathLike[str]]:
    """Each file the chip's family boots with, found with its pinned digest; raises
    :class:`rig_edge.RigError` naming every file missing, the directories searched and the
    files found with another digest."""
    found: dict[str, os.PathLike[str]] = {}
    missing = []
    for name in chip.family.firmware:
        try:
            found[name] = firmware.find(dirs, name, firmware.NVIDIA_GSP_570_144[name])
        except RigError as e:
            missing.append(str(e))
    if missing:
        raise RigError(
            f"{len(missing)} of the {len(chip.family.firmware)} firmware files a {chip.name} "
            f"boots with {'is' if len(missing) == 1 else 'are'} missing (`rig firmware nv` "
            f"downloads them): " + "; ".join(missing)
        )
    return found


# GPUs whose stop could not unload the GSP or take the boot down (or whose boot failed once
# the GSP's memory was taken): their next open resets them first (the spec's lost GPU).
_lost: set[tuple[str, str]] = set()


def lost(machine: Machine, bus: str) -> bool:
    """Whether this process holds the GPU at ``bus`` of ``machine`` lost (a failed reset, a
    stop that could not take its boot down, a boot that failed once the GSP's memory was
    taken): its next open resets it first, and a reset that goes through ends the loss."""
    return (machine.name, bus) in _lost

# GPUs whose device gave another device bus ranges (Device.dma) and then stopped, with what
# keeps them: the function (its DMA memory, windows and files, which its release would give
# back) and the GPU's lock (whose flock refuses every other process). The spec: "The region's
# memory and the GPU then stay the process's until it exits, so no later open of the GPU, in
# this process or another, succeeds meanwhile." Never emptied: the kernel lets both go when
# the process exits.
_kept: dict[tuple[str, str], tuple[Function, lock.BusLock]] = {}
KEPT = ("this process keeps it: another device was given the bus ranges of its memory "
        "(Device.dma), so the memory and the GPU stay the process's until it exits")


def _open(i: int, machine: Machine, dirs: Sequence[str | os.PathLike[str]]) -> Device:
    info = _function(machine, i)
    bus = info.address
    name = _name(i, machine, bus)
    if info.driver not in (None, VFIO_PCI):
        raise RigError(
            f"{name}: the kernel driver {info.driver} holds it: detach it first "
            f"(rig_nv_pci.detach({i}), or `rig detach {i}` as root)"
        )
    _not_held(machine, bus, name)
    taken = _lock(machine, bus, name)
    try:
        f = _take(machine, bus, name)
    except BaseException:
        taken.release()
        raise
    given = done = False  # the device holds the function and the lock; its stop gave them back
    decoding = True  # whether the function answered its BARs before the open turned that on

    def stopped(failure: BaseException | None) -> None:
        nonlocal done
        done = True
        if failure is not None:
            _lost.add((machine.name, bus))
        # f.close frees the GSP's memory and every DMA memory the device had, as huge pages
        # back to the system when taken physically; after a failed stop the GSP may still run
        # and the GPU still write there (rig_nv's Device.stop: "it stays with the process").
        # So bus mastering goes off first (PCIe Base 6.0 7.5.1.1.3: with Bus Master Enable
        # clear the function issues no memory requests), after every stop, as Linux's
        # pci_disable_device leaves a function a driver lets go and rig_pci's reset before a
        # reset; the next open turns it on again. One off the bus may refuse: freed regardless.
        with contextlib.suppress(RigError, OSError):
            f.bus_master(False)
        try:
            f.close()
        finally:
            taken.release()

    def kept() -> None:  # the device stopped with memory another device may reach
        nonlocal done
        done = True
        _kept[(machine.name, bus)] = (f, taken)

    try:
        if not machine.is_this:
            raise RigError(
                f"{name}: {machine.name}'s memory is not this process's, so the windows "
                "an open maps are not the GPU's to reach (a machine reached through a "
                "transport cannot be opened)"
            )
        try:
            # Its BARs answer only with Memory Space Enable set (PCIe Base 6.0 7.5.1.1.3), which
            # Linux sets when a driver enables the function (pci_enable_device, vfio-pci's
            # open); one no driver enabled since the machine started may have it clear, whose
            # registers would read all-ones. tinygrad's PCI path likewise writes sysfs
            # `enable` (tinygrad/runtime/support/system.py PCIDevice). It lets the GPU start
            # nothing; bus mastering waits for the boot (rig_nv_pci.held.open_device).
            decoding = f.memory_space(True)
            chip = chips.identify(_boot42(f))
            if chip.family.boot == "booter":
                _fwsec(f)
            found = _firmware(chip, dirs)
            lost = (machine.name, bus) in _lost
            if lost or _wpr2_up(f) is not None:
                # An earlier boot's WPR2 or a lost GPU: reset first, and the GPU stays reset.
                why = "it was lost" if lost else "its protected memory (WPR2) is up from an " \
                    "earlier boot"
                try:
                    f.reset()
                except RigError as e:
                    raise RigError(f"{why}, and " + _reason(e, bus)) from e
                _lost.discard((machine.name, bus))
                _wpr2_down_after_reset(f)
        except RigError as e:
            raise RigError(f"{name}: {_reason(e, bus)}") from e
        try:
            images = held.read_images(chip, found)
        except RigError as e:
            raise RigError(f"{name}: {e}") from e
        memory_taken = False

        def taken_memory() -> None:
            nonlocal memory_taken
            memory_taken = True

        try:
            # No kernel driver's watchdog watches this GPU's work: rig gives it up after
            # rig_pci.driver.hang_ms without progress (the spec's device hang_ms).
            device = held.open_device(f, name=name, chip=chip, images=images,
                                      device_name=opener_name(PATH, i),
                                      hang_ms=driver.hang_ms, on_stopped=stopped,
                                      on_kept=kept, on_memory_taken=taken_memory)
        except BaseException:
            # The spec: once the GSP's memory is taken, a failure loses the GPU (any failure,
            # a KeyboardInterrupt too), and its next open resets it.
            if memory_taken:
                _lost.add((machine.name, bus))
            raise
        given = True
        return device
    finally:
        if not given and not done:
            # A refused open leaves the GPU as it found it: memory decoding off again where
            # it was off (a boot that failed reset it or left bus mastering off already).
            if not decoding:
                with contextlib.suppress(RigError, OSError):
                    f.memory_space(False)
            f.close()
            taken.release()


def _make(i: int, machine: Machine | None, dirs: Sequence[str | os.PathLike[str]]) -> Device:
    try:
        with lock.serial(f"{opener_name(PATH, i)}'s make"):
            return _open(i, machine or Machine.this(), dirs)
    except OpenRefused:
        raise
    except RigError as e:
        raise OpenRefused(str(e)) from e


def gpu(
    i: int,
    machine: Machine | None = None,
    firmware: Sequence[str | os.PathLike[str]] | None = None,
) -> Opener[Device]:
    """The opener of GPU ``i`` of ``machine`` (this machine by default), named "NV-PCI" for 0
    and "NV-PCI:i" otherwise.

    Its ``make`` boots the GPU that is ith when it runs, reading each firmware file from the
    first of the directories ``firmware`` (``[]`` by default), then
    :func:`rig_pci.firmware.directory`, then /lib/firmware that holds it with its pinned
    digest, and returns its :class:`rig_nv.Device`, which holds the function and the GPU's lock
    until its stop, which stops the GSP (:mod:`rig_nv_pci.held`). Once its ``dma`` gave
    another device bus ranges, its stop keeps the GSP running and the function, the lock and
    that memory for the process until it exits, and every later open or change of the GPU is
    refused saying so. A firmware image not laid out
    as its format says is refused naming the file; a boot that fails once the GSP's memory is
    taken, or a stop that could not take the boot down, leaves the GPU lost, and its next open
    resets it first.

    Before that it raises :class:`rig_edge.OpenRefused`, naming the GPU, then the reason,
    having given back what it took, if: the machine's PCI functions cannot be listed; the
    machine has no GPU i (saying how many it has); a kernel driver holds GPU i (detach it), this
    process holds it already (an open device, or one whose ``dma`` gave bus ranges), or another
    process's open or change holds it; its function cannot
    be taken (:meth:`rig_pci.Function.take`'s reason: its IOMMU group, VFIO, lockdown,
    permissions); the machine is reached through a transport, whose memory is not this
    process's; its chip (NV_PMC_BOOT_42) is not one this library boots, naming it; on Ampere
    and Ada, its VBIOS (read through the PROM window) has no FWSEC this library runs, naming
    what it lacks; a firmware file is missing, naming the directories searched and the files
    found with another digest; or its protected memory (WPR2) is up and still up after the
    reset the open then runs (a GPU so reset stays reset).

    Opens and changes of GPUs run one at a time in the process; ``make`` called from inside
    another open or change (a callback inside the lock of :mod:`rig_nv_pci.lock`: a signal
    handler, a finalizer) raises :class:`rig_edge.Misuse`, having changed nothing. Raises
    :class:`rig_edge.Misuse` (a ValueError) here if ``i`` < 0 or ``firmware`` is a string
    rather than a list of them.
    """
    _index(i)
    if isinstance(firmware, str | bytes):
        raise Misuse("firmware is a list of directories, not one string")
    dirs = list(firmware or [])
    return Opener(opener_name(PATH, i), lambda: _make(i, machine, dirs))


# ---- changes to the machine --------------------------------------------------------------------


def _device_files(machine: Machine, bus: str) -> list[str]:
    """The /dev/nvidiaN through which NVIDIA's kernel driver lends the GPU (N its minor, from
    /proc/driver/nvidia/gpus/BUS/information), so that detach refuses while a process holds
    it; ``[]`` where the driver reports none."""
    try:
        text = machine.sysfs.path(f"/proc/driver/nvidia/gpus/{bus}/information").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isdigit():
            return [f"/dev/nvidia{int(value)}"]
    return []


def _detach(machine: Machine, i: int) -> driver.Progress:
    _index(i)
    with lock.serial("detach"):
        bus = _function(machine, i).address
        name = _name(i, machine, bus)
        _not_held(machine, bus, name)
        held = _lock(machine, bus, name)  # no other process's open or change meanwhile
        try:
            return driver.detach(machine, bus, device_files=_device_files(machine, bus))
        except RigError as e:
            raise RigError(f"{name}: {_reason(e, bus)}") from e
        finally:
            held.release()


def detach(i: int) -> driver.Progress:
    """Detach GPU ``i`` of this machine from its kernel driver so that its opener can take it
    (to vfio-pci behind an IOMMU, else to no driver), unless it is detached already.

    Its users, a display among them, lose the GPU until :func:`attach` or a reboot. Raises
    :class:`rig_edge.RigError` naming the GPU, having written nothing, if the machine's PCI
    functions cannot be listed, there is no GPU i, this process holds it over PCI, another
    process's open or change holds it (waited for as :mod:`rig_nv_pci.lock` says), a process
    holds its /dev/nvidiaN, its DRM nodes or its sysfs files open or mapped (naming the
    process), or as :func:`rig_pci.driver.detach` (debugfs, vfio-pci not loaded, files not
    writable). After its first write it returns :class:`rig_pci.driver.Detached` or
    :class:`rig_pci.driver.PartWay` saying where it stopped. Needs CAP_SYS_ADMIN and write
    access to /sys/bus/pci (root). Raises :class:`rig_edge.Misuse` (a ValueError), having
    changed nothing, if ``i`` < 0 or it is called from inside another open or change (a
    callback inside the lock of :mod:`rig_nv_pci.lock`).
    """
    return _detach(Machine.this(), i)


def _attach(machine: Machine, i: int) -> None:
    _index(i)
    with lock.serial("attach"):
        bus = _function(machine, i).address
        name = _name(i, machine, bus)
        _not_held(machine, bus, name)
        held = _lock(machine, bus, name)

        def after_reset(f: Function) -> None:
            try:
                _wpr2_down_after_reset(f)
            except RigError:
                _lost.add((machine.name, bus))  # a failed reset loses the GPU (the spec)
                raise

        try:
            driver.attach(machine, bus, after_reset=after_reset)
        except ResetFailed as e:
            # its reset was attempted and failed: lost (the spec), unlike a GPU Linux has no
            # reset for or whose function could not be taken, which attach left untouched
            _lost.add((machine.name, bus))
            raise RigError(f"{name}: {_reason(e, bus)}") from e
        except RigError as e:
            raise RigError(f"{name}: {_reason(e, bus)}") from e
        finally:
            held.release()


def attach(i: int) -> None:
    """Give GPU ``i`` of this machine back to its kernel driver, resetting it first as
    :func:`reset` does if no kernel driver has it (:func:`rig_pci.driver.attach`).

    Raises :class:`rig_edge.RigError` naming the GPU if the machine's PCI functions cannot be
    listed, there is no GPU i, this process or another's open holds it, its reset fails
    (:class:`rig_pci.function.ResetFailed`: it was attempted) or leaves its protected memory
    (WPR2) up (either leaves the GPU lost: its next open resets it first; a GPU Linux has no
    reset for, or whose function cannot be taken, is not), or as
    :func:`rig_pci.driver.attach` (files not
    writable, no kernel driver binds it). Raises :class:`rig_edge.Misuse` (a ValueError),
    having changed nothing, if ``i`` < 0 or it is called from inside another open or change.
    """
    _attach(Machine.this(), i)


def reset(i: int, machine: Machine | None = None) -> None:
    """Reset GPU ``i`` of ``machine`` (this machine by default), which ends what an earlier
    boot left running: take its function, turn its bus mastering off, reset the function
    (:meth:`rig_pci.Function.reset`) and check that WPR2 is down.

    Raises :class:`rig_edge.RigError` naming the GPU if the machine's PCI functions cannot be
    listed, there is no GPU i, this process or another's open holds it, its function cannot be
    taken (a kernel driver holds it, say), Linux has no reset for it or it does not respond
    after one, or its protected memory (WPR2) is still up after it; a reset that so failed
    (not one Linux has none for, which changed nothing) leaves the GPU lost, and its next open
    resets it first, as a successful reset ends the loss. Raises
    :class:`rig_edge.Misuse` (a ValueError), having changed nothing, if ``i`` < 0 or it is
    called from inside another open or change.
    """
    _index(i)
    m = machine or Machine.this()
    with lock.serial("reset"):
        bus = _function(m, i).address
        name = _name(i, m, bus)
        _not_held(m, bus, name)
        held = _lock(m, bus, name)
        try:
            with _take(m, bus, name) as f:
                try:
                    if f.can_reset:
                        try:
                            f.reset()
                            _wpr2_down_after_reset(f)
                        except RigError:
                            # the spec: a GPU whose reset has failed is lost, and its next
                            # open resets it first
                            _lost.add((m.name, bus))
                            raise
                        _lost.discard((m.name, bus))
                    else:
                        f.reset()  # Linux has no reset for it: refused, changing nothing
                except RigError as e:
                    raise RigError(f"{name}: {_reason(e, bus)}") from e
        finally:
            held.release()

