"""Device.dma and Device.map_host on the stand-in path (fake_gpu.py): what the device does with
its path's answers, each way (issue 20, items 1 and 6)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rig_edge import Dmabuf, Memory, Refusal, RigError


def test_an_exported_region_is_never_handed_out_again(dev: tuple[Any, Any]) -> None:
    """Rig_nv_nvidia: "The dma-buf holds the object until its last reference goes, freed or
    not": once dma gave a region away, its memory never returns through the reuse cache, while
    memory never exported does (the control)."""
    d, path = dev
    kept = d.alloc(1 << 20, Memory.DEVICE)
    d.free(kept)
    path.complete()
    again = d.alloc(1 << 20, Memory.DEVICE)
    assert again.gpu == kept.gpu  # the cache hands freed memory out again
    buf = d.dma(again)
    try:
        assert isinstance(buf, Dmabuf) and (buf.offset, buf.length) == (0, 1 << 20)
        d.free(again)
        path.complete()
        for _ in range(3):
            assert d.alloc(1 << 20, Memory.DEVICE).gpu != again.gpu
    finally:
        os.close(buf.fd)


def test_a_refused_export_leaves_the_region_reusable(dev: tuple[Any, Any]) -> None:
    """dma's Error (the path refused) gives nothing away: the region's memory is reused as
    any other's."""
    d, path = dev
    r = d.alloc(1 << 20, Memory.DEVICE)
    path.export_refusal = "NV: the kernel driver exports no dma-buf"
    with pytest.raises(RigError, match="exports no dma-buf"):
        d.dma(r)
    d.free(r)
    path.complete()
    assert d.alloc(1 << 20, Memory.DEVICE).gpu == r.gpu


@pytest.mark.parametrize("refusal", [Refusal.NEVER, Refusal.NO_ROOM])
def test_map_host_answers_the_paths_refusal(dev: tuple[Any, Any], refusal: Refusal) -> None:
    """map_host answers Never or No_room as the path does, told apart without text."""
    d, path = dev
    path.map_host_answer = refusal
    assert d.map_host(bytearray(8192)) is refusal


def test_map_host_maps_the_buffer_at_its_own_address(dev: tuple[Any, Any]) -> None:
    """A mapped buffer is a PINNED region whose host is the buffer's address and whose GPU
    address is the path's, at the buffer's offset in its first page; free gives it back."""
    d, path = dev
    buf = bytearray(3 * 4096)
    ffi = path.rm.ffi
    address = int(ffi.cast("uintptr_t", ffi.from_buffer(buf)))
    view = memoryview(buf)[100:]
    r = d.map_host(view)
    assert not isinstance(r, Refusal)
    assert (r.host, r.length, r.kind) == (address + 100, len(view), Memory.PINNED)
    assert r.gpu % 4096 == (address + 100) % 4096 and r.gpu != r.host
    d.free(r)
