"""Which QMD field makes rig's copy kernel slower than the same kernel launched by CUDA
(~1.4 against ~1.8 TB/s over 256 MiB; the memory's mapping ruled out by mapping.py)? Launches
rig's copy16 over 256 MiB with one QMD field changed per variant (clcbc0qmd.h V04_00 bit
positions), checks the copy byte-exact, and prints GB/s (median of 20). An experiment.

    python3 scripts/copy_variants/qmd.py
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import rig_nv_nvidia
from rig_nv import launch as launching
from rig_nv.qmd import LAYOUTS, Qmd

N = 256 << 20
V4 = LAYOUTS[4]
# clcbc0qmd.h V04_00 fields rig leaves at zero, MW(hi:lo).
EXTRA = {
    "OCCUPANCY_THRESHOLD_WARP": (1287, 1280), "OCCUPANCY_MAX_WARP": (1295, 1288),
    "OCCUPANCY_THRESHOLD_REGISTER": (1303, 1296), "OCCUPANCY_MAX_REGISTER": (1311, 1304),
    "OCCUPANCY_THRESHOLD_SHARED_MEM": (1319, 1312), "OCCUPANCY_MAX_SHARED_MEM": (1327, 1320),
    "SEQUENTIALLY_RUN_CTAS": (1138, 1138), "FREE_CTA_SLOTS_EMPTY_SM": (1147, 1140),
    "DEMOTE_L2_EVICT_LAST": (379, 379), "SYNC_DOMAIN_ID": (1149, 1148),
}
LAYOUT = dataclasses.replace(V4, fields={**V4.fields, **EXTRA})


def edits(name: str, value: int) -> Callable[[Qmd], None]:
    return lambda q: q.set(name, value)


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    fn = d.loader.copy_kernels()["copy16"]
    rng = np.random.default_rng()
    data = rng.bytes(N)
    a, b = d.alloc(N), d.alloc(N)
    d.upload(a, data).wait()
    blocks = d.sm_count * 8
    args = (b, a, N // 16)
    d.launch(fn, (blocks,), (256,), args).wait()
    original = {k: p.blob for k, p in fn.prepared.items()}
    q0 = Qmd(LAYOUT, next(iter(original.values()))[:384])
    print("rig's QMD:", {k: hex(q0.get(k)) for k in sorted(LAYOUT.fields)
                         if not k.startswith(("PROGRAM_ADDRESS", "PROGRAM_PREFETCH_ADDR"))})
    shared = [q0.get(k) for k in ("MIN_SM_CONFIG_SHARED_MEM_SIZE",
                                  "TARGET_SM_CONFIG_SHARED_MEM_SIZE",
                                  "MAX_SM_CONFIG_SHARED_MEM_SIZE")]
    variants: list[tuple[str, Callable[[Qmd], None] | None]] = [("as rig does", None)]
    for cfg in (9, 17, 26, shared[2]):  # 32, 64, 100 KiB carveouts, the largest
        def carve(q: Qmd, cfg: int = cfg) -> None:
            q.set("MIN_SM_CONFIG_SHARED_MEM_SIZE", cfg)
            q.set("TARGET_SM_CONFIG_SHARED_MEM_SIZE", cfg)
        variants.append((f"carveout min=target={cfg}", carve))
    variants += [
        ("CWD membar none", edits("CWD_MEMBAR_TYPE", 0)),
        ("no invalidations", lambda q: [q.set(k, 0) for k in LAYOUT.fields
                                        if k.startswith("INVALIDATE_")] and None),
        ("QMD_GROUP_ID 0", edits("QMD_GROUP_ID", 0)),
        ("API_VISIBLE_CALL_LIMIT 0", edits("API_VISIBLE_CALL_LIMIT", 0)),
        ("OCCUPANCY_MAX_WARP 64", edits("OCCUPANCY_MAX_WARP", 64)),
        ("OCCUPANCY_THRESHOLD_WARP 64", edits("OCCUPANCY_THRESHOLD_WARP", 64)),
        ("OCCUPANCY_MAX_REGISTER 255", edits("OCCUPANCY_MAX_REGISTER", 255)),
        ("OCCUPANCY_MAX_SHARED_MEM 255", edits("OCCUPANCY_MAX_SHARED_MEM", 255)),
        ("all OCCUPANCY_* 255", lambda q: [q.set(k, 255) for k in EXTRA
                                           if k.startswith("OCCUPANCY")] and None),
        ("DEMOTE_L2_EVICT_LAST 1", edits("DEMOTE_L2_EVICT_LAST", 1)),
        ("REGISTER_COUNT 32", edits("REGISTER_COUNT", 32)),
        ("as rig does, again", None),
    ]
    rows = []
    for name, edit in variants:
        for k, p in list(fn.prepared.items()):
            blob = bytearray(original[k])
            if edit is not None:
                q = Qmd(LAYOUT, bytes(blob[:384]))
                edit(q)
                blob[:384] = q.data
            fn.prepared[k] = dataclasses.replace(p, blob=bytes(blob), slots=launching.Slots())
        d.upload(b, bytes(16)).wait()
        d.launch(fn, (blocks,), (256,), args).wait()
        ok = bytes(d.download(b)) == data
        t = []
        for i in range(23):
            s = time.perf_counter()
            d.launch(fn, (blocks,), (256,), args).wait()
            if i >= 3:
                t.append(time.perf_counter() - s)
        rows.append((name, N / statistics.median(t) / 1e9, ok))
        print(rows[-1], flush=True)
    d.stop()
    print(f"{'variant':<34}{'GB/s':>8}  byte-exact")
    for name, gbs, ok in rows:
        print(f"{name:<34}{gbs:>8.0f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
