"""Add two vectors on GPU 0, through NVIDIA's kernel driver.

Run: python examples/vadd.py (the cubins are in examples/cubins; examples/build.sh makes them).
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
    n = 1 << 20
    a = np.random.rand(n).astype(np.float32)
    b = np.random.rand(n).astype(np.float32)
    with rig_nv_nvidia.gpu(0).open() as d:  # stopped at the end of the block, even on errors
        image = d.load((CUBINS / f"vadd.{d.arch}.cubin").read_bytes())
        ra, rb, rc = (need(d.alloc(a.nbytes, Memory.DEVICE)) for _ in range(3))
        d.upload(ra, a)
        d.upload(rb, b)
        d.launch(image["vadd"], grid=(n // 256,), block=(256,), args=(ra, rb, rc, n)).wait()
        c = np.frombuffer(d.download(rc), dtype=np.float32)
    assert np.array_equal(c, a + b)
    print(f"vadd: {n} floats added on {d.facts.name}, all equal to numpy's sum")


if __name__ == "__main__":
    main()
