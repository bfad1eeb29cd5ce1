"""Which QMD settings cost time per kernel on this GPU: a 64-launch step's per-kernel cost and a
one-launch step's latency, for QMDs with one setting changed at a time. Run on the GPU machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import rig_nv.launch as launch_module
import rig_nv_nvidia
from rig_edge import Memory
from rig_nv import qmd

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
original = qmd.encode


def variant(change: Callable[[qmd.Qmd], None]) -> Callable[[int, qmd.Launch], bytes]:
    def encode(version: int, launch: qmd.Launch) -> bytes:
        q = qmd.Qmd(qmd.LAYOUTS[version], original(version, launch))
        change(q)
        return q.data

    return encode


def no_invalidate(q: qmd.Qmd) -> None:
    for name in ("INVALIDATE_TEXTURE_HEADER_CACHE", "INVALIDATE_TEXTURE_SAMPLER_CACHE",
                 "INVALIDATE_TEXTURE_DATA_CACHE", "INVALIDATE_SHADER_DATA_CACHE"):
        q.set(name, 0)


def no_membar(q: qmd.Qmd) -> None:
    q.set("CWD_MEMBAR_TYPE", 0)


def small_config(q: qmd.Qmd) -> None:
    q.set("MAX_SM_CONFIG_SHARED_MEM_SIZE", q.get("MIN_SM_CONFIG_SHARED_MEM_SIZE"))


def queue_type(q: qmd.Qmd) -> None:
    q.set("QMD_TYPE", 0)


def boost(d: object, on: bool) -> None:
    """NV2080_CTRL_CMD_PERF_BOOST (ctrl2080perf.h): what CUDA asks of the RM for compute,
    cleared again (CMD_CLEAR) when measured. flags: CMD 1:0 BOOST_TO_MAX 2, CUDA 4:4 YES,
    CUDA_PRIORITY 6:6 HIGH; duration in seconds."""
    import struct

    path = d.path  # type: ignore[attr-defined]
    params = bytearray(struct.pack("<II", 0x52 if on else 0, 10 if on else 0))
    path.rm.control(path.h_subdevice, 0x2080200A, params)


def measure(name: str, encode: Callable[[int, qmd.Launch], bytes], boosted: bool = False,
            local: int = 0) -> str:
    launch_module.qmd.encode = encode  # type: ignore[attr-defined]
    d = rig_nv_nvidia.gpu(0).open()
    if local:
        d._ensure_local(local)
    if boosted:
        boost(d, True)
    try:
        img = d.load(CUBIN.read_bytes())
        r = d.alloc(1 << 20, Memory.DEVICE)
        assert r
        fn = img["vadd"]
        steps = {}
        for count in (1, 64):
            s = d.step()
            for _ in range(count):
                s.launch(fn, (1,), (32,), (r, r, r, 32))
            for _ in range(30):
                s.submit().wait()
            times = []
            for _ in range(300):
                t = time.perf_counter()
                s.submit().wait()
                times.append(time.perf_counter() - t)
            steps[count] = statistics.median(times)
        lat = []
        for _ in range(1000):
            t = time.perf_counter()
            d.launch(fn, (1,), (32,), (r, r, r, 32)).wait()
            lat.append(time.perf_counter() - t)
        per = (steps[64] - steps[1]) / 63
        return (f"{name:<14} step1 {steps[1] * 1e6:6.2f} us  per further kernel "
                f"{per * 1e6:6.2f} us  launch+wait {statistics.median(lat) * 1e6:6.2f} us")
    finally:
        if boosted:
            boost(d, False)
        d.stop()
        launch_module.qmd.encode = original  # type: ignore[attr-defined]


if __name__ == "__main__":
    def prefetch(q: qmd.Qmd) -> None:
        address = q.program()
        q.set("PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED", (address >> 8) & 0xFFFFFFFF)
        q.set("PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED", address >> 40)
        q.set("PROGRAM_PREFETCH_SIZE", 4)

    def sampler(q: qmd.Qmd) -> None:
        q.set("SAMPLER_INDEX", 1)

    def shared_alloc(q: qmd.Qmd) -> None:
        q.set("SHARED_ALLOCATION_ENABLE", 1)

    def group0(q: qmd.Qmd) -> None:
        q.set("QMD_GROUP_ID", 0)

    def no_barrier(q: qmd.Qmd) -> None:
        q.set("BARRIER_COUNT", 0)

    def together(q: qmd.Qmd) -> None:
        for f in (prefetch, sampler, shared_alloc, no_invalidate, no_membar):
            f(q)

    def tinygrad_smem(q: qmd.Qmd) -> None:
        q.set("SHARED_MEMORY_SIZE", max(q.get("SHARED_MEMORY_SIZE"), 0x400))
        q.set("MIN_SM_CONFIG_SHARED_MEM_SIZE", 9)
        q.set("TARGET_SM_CONFIG_SHARED_MEM_SIZE", 9)
        q.set("MAX_SM_CONFIG_SHARED_MEM_SIZE", 26)

    def cbuf0_only(q: qmd.Qmd) -> None:
        lay = q.layout
        for i in range(1, 8):
            q._put(lay.cbuf_invalidate[i], 0, "inv")

    def max_config(q: qmd.Qmd) -> None:
        top = q.get("MAX_SM_CONFIG_SHARED_MEM_SIZE")
        q.set("MIN_SM_CONFIG_SHARED_MEM_SIZE", top)
        q.set("TARGET_SM_CONFIG_SHARED_MEM_SIZE", top)

    def both(q: qmd.Qmd) -> None:
        tinygrad_smem(q)
        cbuf0_only(q)

    def regs8(q: qmd.Qmd) -> None:
        q.set("REGISTER_COUNT", -(-q.get("REGISTER_COUNT") // 8) * 8)

    def no_cbuf_invalidate(q: qmd.Qmd) -> None:
        for i in range(8):
            q._put(q.layout.cbuf_invalidate[i], 0, "inv")

    def sass0(q: qmd.Qmd) -> None:
        q.set("SASS_VERSION", 0)

    rows = [measure("as built", original)]
    for name, f in (("registers x8", regs8), ("no cbuf invalidate", no_cbuf_invalidate),
                    ("sass 0", sass0)):
        rows.append(measure(name, variant(f)))
    print("\n".join(rows))
