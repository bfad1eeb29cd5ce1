"""Softmax of each row with a Triton kernel on GPU 0, launched through rig as Triton's own
launcher launches it (rig_nv.triton), with no Triton and no CUDA library installed.

Run: python examples/triton_softmax.py (the cubins and Triton's metadata of them are in
examples/cubins; examples/triton/build.py makes them, with `pip install triton`).
"""

import json
from pathlib import Path

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory, OutOfMemory, Region
from rig_nv import triton

CUBINS = Path(__file__).resolve().parent / "cubins"


def need(region: Region | None) -> Region:
    """alloc returns None when the GPU is out of that memory: say so here, not a call later."""
    if region is None:
        raise OutOfMemory("GPU 0 has no room for the rows")
    return region


def main() -> None:
    rows, cols, scale = 4096, 1000, 0.5
    x = np.random.standard_normal((rows, cols)).astype(np.float32)
    with rig_nv_nvidia.gpu(0).open() as d:
        built = json.loads((CUBINS / f"triton_softmax.{d.arch}.json").read_text())
        cubin = (CUBINS / f"triton_softmax.{d.arch}.cubin").read_bytes()
        softmax = triton.load(d, cubin, built["metadata"], built["signature"])
        rx, ry = (need(d.alloc(x.nbytes, Memory.DEVICE)) for _ in range(2))
        d.upload(rx, x)
        # Triton's arguments in its order, the constexpr BLOCK (1024) in its place.
        done = softmax[(rows,)](ry, rx, cols, cols, cols, scale, 1024)
        assert done is not None  # None only for an empty grid
        done.wait()
        y = np.frombuffer(d.download(ry), dtype=np.float32).reshape(rows, cols)
    e = np.exp(x * scale - (x * scale).max(axis=1, keepdims=True))
    assert np.allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    print(f"triton_softmax: {rows} rows of {cols} on {d.facts.name}, each numpy's softmax")


if __name__ == "__main__":
    main()
