"""Issue 22, bullet 3: a host-visible region is CPU memory to Python (1-D uint8, no copy)
through a memoryview, numpy's array interface and DLPack; Device memory offers none."""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest

from rig_edge import Memory, Misuse, Region, hostview


def pinned(n: int = 64) -> tuple[ctypes.Array[ctypes.c_uint8], Region]:
    """Host memory of n bytes and a Pinned region over it (its GPU address made up)."""
    memory = (ctypes.c_uint8 * n)()
    return memory, Region(0x7F00_0000_0000, ctypes.addressof(memory), n, Memory.PINNED)


def test_numpy_asarray_reads_and_writes_the_region_in_place() -> None:
    memory, region = pinned()
    a = np.asarray(region)
    assert (a.dtype, a.shape, a.ctypes.data) == (np.uint8, (64,), region.host)
    a[:] = np.arange(64, dtype=np.uint8)
    assert bytes(memory) == bytes(range(64))
    memory[5] = 200
    assert a[5] == 200


def test_numpy_from_dlpack_is_a_writable_cpu_view_without_a_copy() -> None:
    memory, region = pinned()
    assert region.__dlpack_device__() == (1, 0)  # kDLCPU
    t = np.from_dlpack(region)
    assert (t.dtype, t.shape, t.ctypes.data) == (np.uint8, (64,), region.host)
    t[3] = 9
    assert memory[3] == 9


def test_each_dlpack_export_is_released_by_its_consumer_or_its_capsule() -> None:
    _, region = pinned()
    before = hostview.live_exports()
    t = np.from_dlpack(region)
    assert hostview.live_exports() == before + 1
    del t
    gc.collect()
    assert hostview.live_exports() == before
    capsule = region.__dlpack__()  # never consumed: its capsule's destructor releases it
    legacy = region.__dlpack__(max_version=None)
    assert hostview.live_exports() == before + 2
    del capsule, legacy
    gc.collect()
    assert hostview.live_exports() == before


def test_dlpack_refuses_another_device_or_a_copy() -> None:
    _, region = pinned()
    with pytest.raises(BufferError, match="CPU memory"):
        region.__dlpack__(dl_device=(2, 0))  # kDLCUDA: rig's GPU addresses are not CUDA's
    with pytest.raises(BufferError, match="never copies"):
        region.__dlpack__(copy=True)


def test_view_is_a_writable_memoryview_of_bytes() -> None:
    memory, region = pinned(16)
    v = region.view()
    assert (v.format, v.nbytes, v.readonly) == ("B", 16, False)
    v[0:4] = b"rig!"
    assert bytes(memory[0:4]) == b"rig!"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the buffer protocol in Python: 3.12+")
def test_memoryview_of_a_region_on_python_3_12() -> None:
    memory, region = pinned(8)
    memoryview(region)[1] = 7  # type: ignore[arg-type, unused-ignore]
    assert memory[1] == 7


def test_device_memory_has_no_host_view_and_says_why() -> None:
    region = Region(0x1000_0000, None, 4096, Memory.DEVICE)
    for read in (region.view, region.__dlpack__, region.__dlpack_device__, np.asarray):
        with pytest.raises(Misuse, match="no host address"):
            read(region) if read is np.asarray else read()  # type: ignore[operator]
