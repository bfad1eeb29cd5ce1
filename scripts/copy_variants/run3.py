"""Time variants3.cu's copy kernels against rig's shipped copy16 on 256 MiB and 1 GiB inside
GPU 0, on the GPU's clock (a profile) and the host's: each checked byte-exact once, then 20
copies. loopU at 8, 16, 24 and 32 blocks per SM; flatU with one block per chunk. Picks the
kernel for issue 23's D2D target (cuMemcpyDtoD ran 2045 GB/s on the GPU's clock for 256 MiB
on 2026-11-30). An experiment.

    python3 scripts/copy_variants/run3.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import rig_nv_nvidia

HERE = Path(__file__).resolve().parent


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load((HERE / "variants3.sm_90.cubin").read_bytes())
    ship = d.load((HERE.parents[1] / "packages/rig-nv/src/rig_nv/kernels/copy.sm_90.cubin")
                  .read_bytes())
    sms = d.sm_count
    print(f"{'variant':<16}{'MiB':>6}{'blocks':>8}{'GPU GB/s':>10}{'GPU us':>9}"
          f"{'wall GB/s':>10}  byte-exact", flush=True)
    for n in (256 << 20, 1 << 30):
        count = n // 16
        data = np.random.default_rng().bytes(n)
        a, b = d.alloc(n), d.alloc(n)
        d.upload(a, data).wait()
        variants = [("copy16 (rig)", ship["copy16"], sms * 8)]
        for u in (4, 8, 16):
            variants += [(f"loop{u} {per}/SM", img[f"loop{u}"], sms * per)
                         for per in (8, 16, 24, 32)]
            variants.append((f"flat{u}", img[f"flat{u}"], -(-count // (256 * u))))
        variants.append(("copy16 (rig) again", ship["copy16"], sms * 8))
        for name, fn, blocks in variants:
            try:
                d.upload(b, bytes(16)).wait()
                d.launch(fn, (blocks,), (256,), (b, a, count)).wait()
                ok = bytes(d.download(b)) == data
                wall = []
                with d.profile() as p:
                    for _ in range(20):
                        s = time.perf_counter()
                        d.launch(fn, (blocks,), (256,), (b, a, count)).wait()
                        wall.append(time.perf_counter() - s)
                gpu = statistics.median(e.duration_ns for e in p.events()) * 1e-9
                print(f"{name:<16}{n >> 20:>6}{blocks:>8}{n / gpu / 1e9:>10.0f}{gpu * 1e6:>9.1f}"
                      f"{n / statistics.median(wall) / 1e9:>10.0f}  {ok}", flush=True)
            except Exception as e:  # an experiment: say what failed and go on
                print(f"{name:<16}{n >> 20:>6} failed: {type(e).__name__}: {e}"[:120], flush=True)
        d.free(a)
        d.free(b)
    d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
