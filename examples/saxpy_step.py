"""saxpy (y = a*x + y) recorded once as a step and submitted again with a new ``a``.

A step is what CUDA graphs are for: its commands are written once; each submit is one GPFIFO
entry. Pinned memory is host memory the GPU reads: numpy writes it in place, no copy.
Run: python examples/saxpy_step.py
"""

from pathlib import Path

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory, OutOfMemory, Region

CUBINS = Path(__file__).resolve().parent / "cubins"


def need(region: Region | None) -> Region:
    """alloc returns None when the GPU is out of that memory: say so here, not a call later."""
    if region is None:
        raise OutOfMemory("GPU 0 has no room for the vectors")
    return region


def main() -> None:
    n = 1 << 22
    with rig_nv_nvidia.gpu(0).open() as d:
        image = d.load((CUBINS / f"saxpy.{d.arch}.cubin").read_bytes())
        x = need(d.alloc(4 * n, Memory.PINNED))
        y = need(d.alloc(4 * n, Memory.PINNED))
        xs = np.asarray(x).view(np.float32)  # the pinned memory itself, as numpy floats
        ys = np.asarray(y).view(np.float32)
        xs[:] = np.random.rand(n)
        ys[:] = 1.0
        step = d.step()
        saxpy = step.launch(image["saxpy"], grid=(n // 256,), block=(256,), args=(2.0, x, y, n))
        step.submit().wait()  # y = 2x + 1
        step.set_args(saxpy, (3.0, x, y, n))
        step.submit().wait()  # y = 3x + 2x + 1
        # The GPU fuses a*x + y into one rounding (nvcc's FMA), numpy rounds twice.
        assert np.allclose(ys, 5 * xs + 1, rtol=1e-6)
        step.free()
        print(f"saxpy_step: one step submitted twice with a new a on {d.facts.name}; y checked")


if __name__ == "__main__":
    main()
