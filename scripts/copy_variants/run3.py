"""Time variants3.cu's copy kernels against rig's shipped copy (Device.copy(engine="sm")) on
256 MiB and 1 GiB inside GPU 0, 20 copies each (timing.py). loopU at 8, 16, 24 and 32 blocks
per SM; flatU with one block per chunk. Picked the kernel for issue 23's D2D target
(cuMemcpyDtoD ran 2045 GB/s on the GPU's clock for 256 MiB on 2026-11-30): flat4, which rig
ships since (docs/results/copy-variants-2026-12-01.txt; that run timed the looped copy16 of
then, at 8 blocks an SM). An experiment.

    python3 scripts/copy_variants/run3.py
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

from timing import Variant, table

HERE = Path(__file__).resolve().parent


def variants(d: Any, img: Any, dst: Any, src: Any, n: int) -> list[Variant]:
    count = n // 16
    rig: Variant = ("rig copy", -(-count // 1024), partial(d.copy, dst, src, n, engine="sm"))
    out = [rig]
    for u in (4, 8, 16):
        out += [(f"loop{u} {per}/SM", d.sm_count * per,
                 partial(d.launch, img[f"loop{u}"], (d.sm_count * per,), (256,),
                         (dst, src, count))) for per in (8, 16, 24, 32)]
        blocks = -(-count // (256 * u))
        out.append((f"flat{u}", blocks, partial(d.launch, img[f"flat{u}"], (blocks,), (256,),
                                                (dst, src, count))))
    return [*out, ("rig copy again", *rig[1:])]


if __name__ == "__main__":
    sys.exit(table(HERE / "variants3.sm_90.cubin", (256 << 20, 1 << 30), variants, 20))
