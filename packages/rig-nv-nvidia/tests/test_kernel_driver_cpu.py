"""Promises of Rig_nv_nvidia.txt kept against a stand-in of NVIDIA's kernel driver (fake_kernel.py,
the ``kernel`` fixture): the open's refusals and what stays, usage's files, the watchdog's
hang_ms, the reservation, map_host's answers and dma's dma-bufs (issue 20, items 1, 2, 3, 6, 7).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from fake_kernel import (
    BUS,
    CLIENT,
    FB_INFO,
    NV_ERR_INVALID_ADDRESS,
    NV_ERR_INVALID_ARGUMENT,
    NV_ERR_NO_MEMORY,
    NV_ERR_NOT_SUPPORTED,
    WATCHDOG_DISABLED,
    WATCHDOG_INITIALIZED,
    WATCHDOG_RUNNING,
)

from rig_edge import Dmabuf, Memory, Misuse, OpenRefused, Refusal, RigError
from rig_nv.rm import Allocation, RMError
from rig_nv_nvidia import driver, gpu, opener, usage
from rig_nv_nvidia import path as path_module
from rig_nv_nvidia.listing import gpu_functions
from rig_nv_nvidia.path import NvidiaPath
from rig_pci import Machine
from rig_pci.testing import add_function


def one_gpu(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """A fixture machine whose GPU 0 is at BUS, held by NVIDIA's driver and active."""
    add_function(root, BUS, vendor=0x10DE, device=0x2335, class_code=0x030200, driver="nvidia")
    monkeypatch.setattr(opener, "gpu_functions", lambda: gpu_functions(Machine.at(root)))
    monkeypatch.setattr(path_module, "PCI_DEVICES", str(root / "sys/bus/pci/devices"))


def opened_path(kernel: Any, monkeypatch: pytest.MonkeyPatch, root: Path) -> NvidiaPath:
    """The path of GPU 0 as an open makes it, without the device on top."""
    one_gpu(monkeypatch, root)
    p = kernel.process
    rm, g = p.client(), p.gpu(BUS)
    p.unified_memory()
    return NvidiaPath("NV", g, rm, hang_ms=None)


def with_memory(kernel: Any, monkeypatch: pytest.MonkeyPatch,
                root: Path) -> tuple[NvidiaPath, Allocation]:
    """:func:`opened_path` and 1 MiB of Device memory on it."""
    p = opened_path(kernel, monkeypatch, root)
    a = p.alloc_memory(1 << 20, Memory.DEVICE)
    assert a is not None
    return p, a


# -- the open's refusals and what stays (items 2, 6) -----------------------------------------


def test_an_unaccepted_release_refuses_the_open_and_gives_back_the_client(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """make is Error if "the kernel driver's release is none of those Rig_nv.make accepts",
    having given back what it took: the RM client is freed and the control file closed, so
    nothing stays (the next open makes them again)."""
    one_gpu(monkeypatch, tmp_path)
    kernel.release = "595.44.02"
    with pytest.raises(OpenRefused, match=r"release 595\.44\.02 is not supported") as e:
        gpu(0).open()
    assert e.value.stays == ""
    assert kernel.freed == [CLIENT] and kernel.objects == {}
    assert kernel.opened == ["nvidiactl"] and kernel.open_files() == []
    assert kernel.process.rm is None
    with pytest.raises(RigError, match="not supported") as u:
        usage(0)
    assert not isinstance(u.value, OpenRefused)  # usage opens nothing: its error is no open's


def test_a_callback_inside_the_clients_making_is_refused_and_makes_no_second_client(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """make and usage raise Invalid_argument, having opened nothing, "from a callback inside a
    lock": here one runs (as a signal handler would) while the first usage makes the client,
    holding the process's lock. It is refused, and the one client is made once."""
    one_gpu(monkeypatch, tmp_path)
    inner = driver.open_file
    refused: list[BaseException] = []

    def open_file(name: str) -> int:
        if not refused:
            for call in (lambda: gpu(0).open(), lambda: usage(0)):
                try:
                    call()
                except Misuse as e:
                    refused.append(e)
        return inner(name)

    monkeypatch.setattr(driver, "open_file", open_file)
    assert usage(0).memory_total == FB_INFO[0x7] * 1024
    assert len(refused) == 2 and all("callback inside" in str(e) for e in refused)
    assert kernel.opened == ["nvidiactl", "nvidia0"]
    assert [h for h, (c, _) in kernel.objects.items() if c == 0x41] == [CLIENT]


def test_usage_keeps_the_gpus_file_open(kernel: Any, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """"The GPU's device file stays open until the process exits": after usage returns, the
    control file and the GPU's file are still open, and a second usage opens neither again."""
    one_gpu(monkeypatch, tmp_path)
    u = usage(0)
    assert (u.memory_total, u.memory_free) == (FB_INFO[0x7] * 1024, FB_INFO[0x16] * 1024)
    assert kernel.open_files() == ["nvidia0", "nvidiactl"]
    usage(0)
    assert kernel.opened == ["nvidiactl", "nvidia0"]
    assert kernel.open_files() == ["nvidia0", "nvidiactl"]


# -- hang_ms follows the watchdog (item 3) ---------------------------------------------------


@pytest.mark.parametrize(("flags", "hang_ms"), [
    (WATCHDOG_INITIALIZED | WATCHDOG_RUNNING, None),
    (WATCHDOG_INITIALIZED | WATCHDOG_DISABLED, 30_000),
    (WATCHDOG_INITIALIZED, 30_000),  # initialized, not running (a GPU not at full power)
    (0, 30_000),
])
def test_hang_ms_is_none_only_while_the_rms_watchdog_runs(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: int,
        hang_ms: int | None) -> None:
    """"While the RM's watchdog runs on the GPU ... the device's hang_ms is None"; elsewhere it
    is 30 s. The RM's NV2080_CTRL_CMD_RC_GET_WATCHDOG_INFO answers, not the display."""
    one_gpu(monkeypatch, tmp_path)
    kernel.watchdog = flags
    p = kernel.process
    assert opener._hang_ms(p.client(), p.gpu(BUS)) == hang_ms


def test_the_kernel_path_asks_for_no_interrupt(kernel: Any, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """Issue 23: the non-stall interrupt only where a path waits on it. This path's sleep is
    a timed nap, so its submissions ask for none (rig_nv.rm.Path.wakes_on_interrupt)."""
    assert opened_path(kernel, monkeypatch, tmp_path).wakes_on_interrupt is False


# -- the reservation (item 7) -----------------------------------------------------------------


def test_a_reservation_the_kernel_puts_elsewhere_is_refused(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The first open keeps "a reservation of the process's addresses from 384 GiB to 2^40": a
    kernel that takes MAP_FIXED_NOREPLACE for a hint (before Linux 4.17) maps it elsewhere,
    which is unmapped again and refused, with UVM's two files closed."""
    one_gpu(monkeypatch, tmp_path)
    lo, hi = driver.RESERVATION
    kernel.reservation_at = 0x7F00_0000_0000
    kernel.process.client()
    with pytest.raises(RigError, match="put the reservation at 0x7f0000000000"):
        kernel.process.unified_memory()
    assert kernel.mapped == [(lo, hi - lo)]
    assert kernel.unmapped == [(0x7F00_0000_0000, hi - lo)]
    assert kernel.process.uvm is None and "nvidia-uvm" not in kernel.open_files()
    kernel.reservation_at = None
    assert kernel.process.unified_memory() > 0
    assert kernel.open_files().count("nvidia-uvm") == 2


# -- map_host: Never or No_room (item 6) -------------------------------------------------------


def test_map_host_answers_never_for_pages_that_cannot_be_pinned(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """"The kernel driver answers Never for any pin that falls short" (os-mlock.c answers
    NV_ERR_INVALID_ADDRESS), having made nothing."""
    p = opened_path(kernel, monkeypatch, tmp_path)
    before = dict(kernel.objects)
    kernel.pin_status = NV_ERR_INVALID_ADDRESS
    assert p.map_host(0x7000_0000, 0x2000) is Refusal.NEVER
    assert kernel.objects == before and kernel.ranges == set()


@pytest.mark.parametrize("where", ["pin", "gpu addresses"])
def test_map_host_answers_no_room_for_a_lack_of_the_rms_memory(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str) -> None:
    """"... and No_room only for a lack of the RM's own memory, of GPU addresses or of the
    process's files": NV_ERR_NO_MEMORY from the pin, or from UVM mapping the pages for the
    GPU, is No_room, and what was made is given back."""
    p = opened_path(kernel, monkeypatch, tmp_path)
    before = dict(kernel.objects)
    if where == "pin":
        kernel.pin_status = NV_ERR_NO_MEMORY
    else:
        kernel.uvm_map_status = NV_ERR_NO_MEMORY
    assert p.map_host(0x7000_0000, 0x2000) is Refusal.NO_ROOM
    assert kernel.objects == before and kernel.ranges == set()


def test_map_host_maps_the_pages_at_a_gpu_address_of_their_own(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Host memory map_host maps "lies at a GPU address of its own"; another RM refusal
    raises, naming it."""
    p = opened_path(kernel, monkeypatch, tmp_path)
    a = p.map_host(0x7000_0000, 0x2000)
    assert isinstance(a, Allocation) and a.host == 0x7000_0000 and a.gpu != a.host
    assert kernel.objects[a.handle][0] == 0x71  # NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
    assert kernel.ranges == {(a.gpu, 0x2000)}
    p.free_memory(a)
    assert kernel.ranges == set() and a.handle not in kernel.objects
    kernel.pin_status = NV_ERR_INVALID_ARGUMENT
    with pytest.raises(RMError, match="NV_ERR_INVALID_ARGUMENT"):
        p.map_host(0x7000_0000, 0x2000)


# -- dma: the dma-buf holds the object; its three errors (items 1, 6) --------------------------


def test_an_exported_region_is_held_so_rig_never_hands_it_out_again(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dma exports "a new dma-buf ... The dma-buf holds the object until its last reference
    goes, freed or not": the export marks the allocation held (rig_nv.Device never keeps held
    memory for reuse), and freeing it frees rig's handle only; the dma-buf's own stays, its
    file open."""
    p = opened_path(kernel, monkeypatch, tmp_path)
    a = p.alloc_memory(4 << 20, Memory.DEVICE)
    assert a is not None and not a.held
    buf = p.export(a, 0x1000, 0x2000)
    assert isinstance(buf, Dmabuf) and (buf.offset, buf.length) == (0x1000, 0x2000)
    assert a.held
    assert kernel.dmabufs[buf.fd] == [a.handle]
    p.free_memory(a)
    assert kernel.freed[-1] == a.handle and a.handle not in kernel.objects
    os.fstat(buf.fd)  # still open: the importer's reference, not rig's


def test_dma_is_error_where_the_kernel_driver_exports_none(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dma "is Error where the kernel driver exports none": the escape refused, or the RM's
    NV_ERR_NOT_SUPPORTED (nv-dmabuf.c, without dma-buf support); nothing is marked held."""
    p, a = with_memory(kernel, monkeypatch, tmp_path)
    kernel.export_errno = errno.EINVAL
    with pytest.raises(RigError, match="exports no dma-buf"):
        p.export(a, 0, a.length)
    kernel.export_errno, kernel.export_status = None, NV_ERR_NOT_SUPPORTED
    with pytest.raises(RMError, match="exports no dma-buf"):
        p.export(a, 0, a.length)
    assert not a.held and kernel.dmabufs == {}


def test_dma_is_error_for_an_fn_that_is_no_function(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dma is Error "for an fn that is no function under /sys/bus/pci/devices", asking the
    driver nothing."""
    p, a = with_memory(kernel, monkeypatch, tmp_path)
    monkeypatch.setattr(path_module, "PCI_DEVICES", str(tmp_path / "elsewhere"))
    with pytest.raises(RigError, match=f"{BUS} is no function under"):
        p.export(a, 0, a.length)
    assert not a.held and kernel.dmabufs == {}


def test_dma_is_error_for_an_object_that_is_no_whole_number_of_pages(
        kernel: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dma is Error "for an object that is no whole number of the host's pages", asking the
    driver nothing."""
    p, a = with_memory(kernel, monkeypatch, tmp_path)
    part = Allocation(a.gpu, None, os.sysconf("SC_PAGE_SIZE") + 0x800, Memory.DEVICE, a.handle)
    with pytest.raises(RigError, match="no whole number of the host's pages"):
        p.export(part, 0, part.length)
    assert not part.held and kernel.dmabufs == {}
