"""Two GPUs of one machine: GPU 1 adds vectors that lie in GPU 0's memory.

``d1.map_peer(d0, r)`` maps GPU 0's region into GPU 1's address space at the same address,
where the RM says the GPUs reach each other (NVLink or PCIe peer-to-peer).
Run: python examples/peers.py (it says so and exits when the machine has not two such GPUs).
"""

from pathlib import Path

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory, OutOfMemory, Region

CUBINS = Path(__file__).resolve().parent / "cubins"


def need(region: Region | None) -> Region:
    """alloc returns None when the GPU is out of that memory: say so here, not a call later."""
    if region is None:
        raise OutOfMemory("no room for the vectors")
    return region


def main() -> None:
    if rig_nv_nvidia.count() < 2 or not rig_nv_nvidia.reaches(0, 1):
        print("peers: this machine has not two GPUs that reach each other")
        return
    n = 1 << 20
    a = np.random.rand(n).astype(np.float32)
    b = np.random.rand(n).astype(np.float32)
    with rig_nv_nvidia.gpu(0).open() as d0, rig_nv_nvidia.gpu(1).open() as d1:
        ra, rb = need(d0.alloc(a.nbytes, Memory.DEVICE)), need(d0.alloc(b.nbytes, Memory.DEVICE))
        d0.upload(ra, a)
        d0.upload(rb, b).wait()
        pa, pb = d1.map_peer(d0, ra), d1.map_peer(d0, rb)  # GPU 0's memory, seen by GPU 1
        rc = need(d1.alloc(a.nbytes, Memory.DEVICE))
        image = d1.load((CUBINS / f"vadd.{d1.arch}.cubin").read_bytes())
        d1.launch(image["vadd"], grid=(n // 256,), block=(256,), args=(pa, pb, rc, n)).wait()
        c = np.frombuffer(d1.download(rc), dtype=np.float32)
        d1.free(pa)  # a peer mapping goes before its owner's memory
        d1.free(pb)
    assert np.array_equal(c, a + b)
    print("peers: GPU 1 added vectors held in GPU 0's memory; all equal to numpy's sum")


if __name__ == "__main__":
    main()
