"""Probe (issue 17): whether a queue's vadd runs while a spin runs. ``VARIANT:GROUP[:same]``:
variant "wfi": launches end with the channel's release after a wait for idle (SEM_EXECUTE
RELEASE_WFI); "nowfi": A's release without the WFI (its point then lies: a probe only); "qmd":
the QMD releases (rig_nv.setup.RELEASE_BY_QMD). GROUP: rig_nv.setup.QUEUE_GROUP. With "same"
the vadd goes on A's queue, behind the spin. "wide" launches one vadd at a value above 2**32
on a fresh queue and prints the word (a QMD release of 32 bits would leave its top half 0).
RIG_PROBE_CONTROL (hex) replaces the V4 QMD release's control bits (rig_nv.qmd.Release).
Prints what happened. Run on the GPU machine."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

import rig_nv.setup
import rig_nv_nvidia
from rig_edge import Memory
from rig_nv import qmd
from rig_nv.push import SEM_RELEASE_WFI

rig_nv.setup.ORDER = os.environ.get("RIG_PROBE_ORDER", rig_nv.setup.ORDER)
if "RIG_PROBE_CONTROL" in os.environ:
    _v4 = qmd.LAYOUTS[4]
    assert _v4.release is not None
    qmd.LAYOUTS[4] = dataclasses.replace(_v4, release=dataclasses.replace(
        _v4.release, control=int(os.environ["RIG_PROBE_CONTROL"], 16)))

TESTS = Path(__file__).resolve().parents[1] / "packages"
CUBIN = TESTS / "rig-nv" / "tests" / "cubins" / "kernels.sm_90.cubin"
FAULTS = TESTS / "rig-nv-nvidia" / "tests" / "cubins" / "faults.sm_90.cubin"


def no_wfi(words: array[int]) -> array[int]:
    out = array("I", words)
    for i, w in enumerate(out):
        if w & SEM_RELEASE_WFI and (w & 0x3) == 1:  # the SEM_EXECUTE word of a release
            out[i] = w & ~SEM_RELEASE_WFI
    return out


def inputs(d: Any, q: Any, n: int) -> tuple[np.ndarray, np.ndarray, Any, Any]:
    """Fresh a and b, uploaded through ``q`` into new regions (both waited for)."""
    a, b = (np.random.default_rng().random(n, dtype=np.float32) for _ in range(2))
    ra, rb = d.alloc(4 * n), d.alloc(4 * n)
    assert ra and rb
    q.upload(ra, a)
    q.upload(rb, b).wait()
    return a, b, ra, rb


def spin_flag(d: Any) -> tuple[Any, ctypes.c_int]:
    """Pinned memory for the spin's flag, and the flag (0: spin on; 1: end)."""
    flag = d.alloc(4096, Memory.PINNED)
    assert flag is not None and flag.host is not None
    word = ctypes.c_int.from_address(flag.host)
    word.value = 0
    return flag, word


def probe(variant: str, group: str, same: bool) -> str:
    rig_nv.setup.QUEUE_GROUP = group
    rig_nv.setup.RELEASE_BY_QMD = variant == "qmd"
    d = rig_nv_nvidia.gpu(0).open()
    try:
        img = d.load(CUBIN.read_bytes())
        spin = d.load(FAULTS.read_bytes())["spin"]
        qa, qb = d.queue(), d.queue()
        if same:
            qb = qa
        if variant == "nowfi":
            t = qa.timeline
            t.launch_words = no_wfi(t.launch_words)
            t._release = no_wfi(t._release)
        n = 1 << 20
        a, b, ra, rb = inputs(d, qb, n)
        out = d.alloc(4 * n)
        assert out
        flag, word = spin_flag(d)
        qa.launch(spin, (1,), (32,), (flag,))
        time.sleep(0.01)
        t0 = time.perf_counter()
        pb = qb.launch(img["vadd"], ((n + 255) // 256,), (256,), (ra, rb, out, n))
        try:
            pb.wait(timeout_s=3)
            dt = time.perf_counter() - t0
            ok = np.array_equal(np.frombuffer(bytes(qb.download(out, 4 * n)), np.float32), a + b)
            res = f"B done while A spins after {dt * 1e3:.2f} ms, right={ok}"
        except Exception as e:
            res = f"B not done: {type(e).__name__}: {e}"
        word.value = 1
        try:
            d.synchronize()
        except Exception as e:
            res += f"; after release: {type(e).__name__}: {e}"
        return res
    finally:
        d.stop()


def chain(same: bool) -> str:
    """Queue A: the spin, then a vadd behind it; with ``same`` nothing else, else queue B's
    vadd too. In order, A's vadd is not done while A spins; B's is."""
    d = rig_nv_nvidia.gpu(0).open()
    try:
        img = d.load(CUBIN.read_bytes())
        spin = d.load(FAULTS.read_bytes())["spin"]
        qa, qb = d.queue(), d.queue()
        n = 1 << 20
        a, b, ra, rb = inputs(d, qb, n)
        oa, ob = d.alloc(4 * n), d.alloc(4 * n)
        assert oa and ob
        flag, word = spin_flag(d)
        grid = ((n + 255) // 256,)
        ps = qa.launch(spin, (1,), (32,), (flag,))
        pa = qa.launch(img["vadd"], grid, (256,), (ra, rb, oa, n))
        res = []
        if not same:
            pb = qb.launch(img["vadd"], grid, (256,), (ra, rb, ob, n))
            try:
                pb.wait(timeout_s=3)
                res.append("B done while A spins")
            except Exception as e:
                res.append(f"B not done while A spins ({type(e).__name__})")
        time.sleep(0.2)
        res.append(f"A's vadd done while A spins: {pa.signaled} (spin {ps.signaled}, "
                   f"word {qa.timeline.word[0]}, values {ps.value} {pa.value})")
        word.value = 1
        try:
            pa.wait(timeout_s=3)
            got = np.frombuffer(bytes(qa.download(oa, 4 * n)), np.float32)
            res.append(f"after: A right={np.array_equal(got, a + b)}")
        except Exception as e:
            res.append(f"after: A {type(e).__name__}: {e}; word {qa.timeline.word[0]}")
        return "; ".join(res)
    finally:
        d.stop()


def wide() -> str:
    rig_nv.setup.RELEASE_BY_QMD = True
    d = rig_nv_nvidia.gpu(0).open()
    try:
        img = d.load(CUBIN.read_bytes())
        q = d.queue()
        n = 1 << 16
        ra, rb, out = (d.alloc(4 * n) for _ in range(3))
        args = (ra, rb, out, n)
        q.launch(img["vadd"], ((n + 255) // 256,), (256,), args).wait(timeout_s=3)
        q.timeline.next = (1 << 32) + 7
        p = q.launch(img["vadd"], ((n + 255) // 256,), (256,), args)
        try:
            p.wait(timeout_s=3)
            res = "reached"
        except Exception as e:
            res = f"{type(e).__name__}"
        return f"wide: point {p.value:#x} {res}; word {q.timeline.word[0]:#x}"
    finally:
        d.stop()


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if arg == "wide":
            print(wide(), flush=True)
            continue
        if arg in ("chain", "chain-same"):
            print(f"{arg:16} {chain(arg == 'chain-same')}", flush=True)
            continue
        variant, group, *same = arg.split(":")
        print(f"{arg:16} {probe(variant, group, bool(same))}", flush=True)
