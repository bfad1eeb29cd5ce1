"""Issue 22, bullet 3: ``with`` stops a Device at the block's end, on an exception too; a
Pinned region of a device is CPU memory numpy and DLPack read in place."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rig_edge import Memory, RigError


def test_with_stops_the_device_even_when_the_block_raises() -> None:
    from fake_gpu import open_fake

    d, path = open_fake()
    with pytest.raises(KeyError), d as held:
        assert held is d
        assert d.alloc(4096, Memory.DEVICE) is not None
        raise KeyError("the caller's own error, which must propagate")
    assert path.mapped == []  # the path was closed: every mapping of the device is gone
    with pytest.raises(RigError, match="stopped"):
        d.alloc(4096, Memory.DEVICE)


def test_a_pinned_region_is_numpy_and_dlpack_memory_in_place() -> None:
    from fake_gpu import open_fake

    d, _ = open_fake()
    with d:
        region = d.alloc(1 << 16, Memory.PINNED)
        assert region is not None and region.host is not None
        a = np.asarray(region)
        a[:] = 0x5A
        assert ctypes.string_at(region.host, 8) == b"\x5a" * 8
        t = np.from_dlpack(region)
        t[0] = 1
        assert ctypes.string_at(region.host, 1) == b"\x01" and t.shape == (1 << 16,)
