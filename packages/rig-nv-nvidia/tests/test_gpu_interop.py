"""Issue 22, bullet 3, on the GPU: a Pinned region is CPU memory numpy and DLPack write in
place, and the GPU's copy engine reads those very bytes; ``with`` stops the device."""

from __future__ import annotations

import numpy as np
import pytest

import rig_nv_nvidia
from rig_edge import Memory, RigError

pytestmark = pytest.mark.gpu


def test_numpy_and_dlpack_views_of_pinned_memory_are_what_the_gpu_reads() -> None:
    n = 1 << 20
    data = np.random.default_rng().integers(0, 256, n, dtype=np.uint8)
    with rig_nv_nvidia.gpu(0).open() as d:
        pinned, dev = d.alloc(n, Memory.PINNED), d.alloc(n, Memory.DEVICE)
        assert pinned is not None and dev is not None
        np.asarray(pinned)[: n // 2] = data[: n // 2]
        np.from_dlpack(pinned)[n // 2 :] = data[n // 2 :]
        d.copy(dev, pinned).wait()  # the GPU's copy engine reads the pinned pages
        assert bytes(d.download(dev)) == data.tobytes()
        np.asarray(pinned)[:] = 0
        d.copy(pinned, dev).wait()  # and writes them: the views see it
        assert np.array_equal(pinned.view(), data)
    with pytest.raises(RigError, match="stopped"):
        d.alloc(n, Memory.DEVICE)
