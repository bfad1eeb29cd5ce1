"""Does the compute channel's subcontext (an asynchronous one, NV_CTXSHARE_ALLOCATION_FLAGS
SUBCONTEXT_ASYNC, as rig makes it, or VEID 0's synchronous one) limit the SMs a grid runs on,
and so the copy kernel's bandwidth? For each: the distinct %smid of a 8-blocks-per-SM grid
(smid.cu), and rig's copy of 256 MiB (median of 20, byte-exact). An experiment.

    python3 scripts/copy_variants/subcontext.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import rig_nv_nvidia
from rig_nv import setup

N = 256 << 20
HERE = Path(__file__).resolve().parent


def measure(flags: int) -> tuple[int, int, float, bool]:
    setup.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC = flags
    d = rig_nv_nvidia.gpu(0).open()
    try:
        fn = d.load((HERE / "smid.sm_90.cubin").read_bytes())["smid"]
        blocks = d.sm_count * 8
        out = d.alloc(blocks * 4)
        d.launch(fn, (blocks,), (256,), (out,)).wait()
        sms = len(set(np.frombuffer(bytes(d.download(out)), dtype=np.uint32)))
        data = np.random.default_rng().bytes(N)
        a, b = d.alloc(N), d.alloc(N)
        d.upload(a, data).wait()
        d.copy(b, a).wait()
        ok = bytes(d.download(b)) == data
        t = []
        for i in range(23):
            s = time.perf_counter()
            d.copy(b, a).wait()
            if i >= 3:
                t.append(time.perf_counter() - s)
        return d.sm_count, sms, N / statistics.median(t) / 1e9, ok
    finally:
        d.stop()


def main() -> int:
    rows = [(name, *measure(flags)) for name, flags in
            (("async (rig)", 1), ("sync (VEID 0)", 0), ("async (rig), again", 1))]
    print(f"{'subcontext':<22}{'SMs':>5}{'ran on':>8}{'GB/s':>8}  byte-exact")
    for name, count, sms, gbs, ok in rows:
        print(f"{name:<22}{count:>5}{sms:>8}{gbs:>8.0f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
