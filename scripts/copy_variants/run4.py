"""Which geometry copies 64 KiB to 64 MiB inside GPU 0 fastest: rig's shipped copy (copy16,
one block a chunk of 1024 units, through Device.copy(engine="sm")) against variants4.cu's
flatU (one block a chunk of 256 x U units) and loopU on at most one block an SM (fewer,
bigger blocks). 50 copies each (timing.py). For issue 23's small D2D rows (bench row 10,
1 MiB and 16 MiB). An experiment.

    python3 scripts/copy_variants/run4.py
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
    out: list[Variant] = [("rig copy", -(-count // 1024), partial(d.copy, dst, src, n,
                                                                  engine="sm"))]
    for name, u, most in [*((f"flat{u}", u, 1 << 31) for u in (1, 2, 4, 8, 16)),
                          ("loop4 <=1/SM", 4, d.sm_count), ("loop16 <=1/SM", 16, d.sm_count)]:
        blocks = min(most, -(-count // (256 * u)))
        out.append((name, blocks, partial(d.launch, img[name.split()[0]], (blocks,), (256,),
                                          (dst, src, count))))
    return out


if __name__ == "__main__":
    sys.exit(table(HERE / "variants4.sm_90.cubin",
                   (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20), variants, 50))
