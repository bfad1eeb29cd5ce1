"""The bench's rows and its arithmetic: what each row times, its unit and target, and how
samples become values, rounds become one table, and rig's ratio to its reference is taken.

A row's value is the median of its samples (p99 or max where it says); a GB/s row turns seconds
into bytes per second. Each round's ratio is rig over the reference peer of the same round
(CUDA from C unless the row names another); the table's ratio is the median of the rounds'
ratios, with their min and max, and the target is judged on that median. ``self_check`` runs
this arithmetic on made-up rounds whose answers are known (``run.py --dry``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from common import ALLOCS, SWEEP, wanted

PEERS = ("rig", "cuda", "torch", "cupy")
IMPORTS = ("rig_edge", "rig_pci", "rig_nv", "rig_nv_nvidia", "rig_cli", "torch", "cupy")


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str  # "us", "ms", "CPU s/s", "x" (lower is better); "GB/s", "TFLOP/s", "launches/s"
    # ("<=" | ">=", ratio to ref), ("ms<=", ms) or ("x<=", rig's own value, a ratio)
    target: tuple[str, float] | None = None
    cuda_key: str | None = None  # the CUDA row to compare with, where not the same key
    ref: str = "cuda"  # the peer rig's ratio is taken against
    source: str | None = None  # a row whose samples this one summarises by ``stat``
    stat: str = "median"  # "median", "p99" or "max" of the samples


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def sweep_rows() -> list[Row]:
    """Row 10: copies by size per kind; D2D also on each of rig's engines (against CUDA's D2D)."""
    rows = []
    for kind in ("h2d", "d2h", "d2d", "d2d_ce", "d2d_sm"):
        for name, n in SWEEP:
            base = kind.split("_", maxsplit=1)[0]
            rows.append(Row(f"10_{kind}_{name}", f"10 {kind.replace('_', ' ')} {size_text(n)}",
                            "GB/s",
                            None, None if kind == base else f"10_{base}_{name}"))
    return rows



ROWS = (
    Row("1_launch", "1 launch+wait, 1 kernel", "us", ("<=", 1.0)),
    Row("1_launch_p99", "1 launch+wait, p99", "us", None, source="1_launch", stat="p99"),
    Row("1_launch_max", "1 launch+wait, max", "us", None, source="1_launch", stat="max"),
    Row("2_step64", "2 step of 64 dependent kernels", "us", ("<=", 1.0)),
    Row("2_step1", "2 step of 1 kernel", "us", ("<=", 1.0)),
    Row("2_per_kernel", "2 each further kernel (t64-t1)/63", "us", ("<=", 1.0)),
    Row("3_flight", "3 10,000 1-kernel steps, per step", "us", ("<=", 1.0)),
    Row("3_launch_flight", "3' 10,000 launches, per launch", "us"),
    Row("3_flight_batched", "3' 10,000 steps, one submit(times=)", "us", ("<=", 1.0),
        "3_flight"),
    Row("3_flight_queue", "3' the same on a queue", "us", ("<=", 1.0), "3_flight"),
    Row("4_h2d_pinned", "4 H2D 256 MiB pinned", "GB/s", (">=", 0.98)),
    Row("4_d2h_pinned", "4 D2H 256 MiB pinned", "GB/s", (">=", 0.98)),
    Row("4_h2d_pageable", "4 H2D 256 MiB pageable", "GB/s", (">=", 1.5)),
    Row("4_d2h_pageable", "4 D2H 256 MiB pageable", "GB/s", (">=", 1.5)),
    Row("4_h2d_map_host", "4' H2D pageable, map_host+copy+free", "GB/s", (">=", 1.5),
        "4_h2d_pageable"),
    Row("4_d2h_map_host", "4' D2H pageable, map_host+copy+free", "GB/s", (">=", 1.5),
        "4_d2h_pageable"),
    Row("5_d2d", "5 D2D 256 MiB", "GB/s", (">=", 0.95)),  # issue 23's faster copy kernel
    # Row 6 (issue 23): rig's reuse cache against CuPy's pool (torch's caching allocator in its
    # column); rig with its cache left out (trim after each free) against cuMemAlloc+cuMemFree.
    *(Row(k, f"6 alloc+free {size_text(n)}, pools", "us", ("<=", 1.0), ref="cupy")
      for k, n, _ in ALLOCS),
    *(Row(f"{k}_raw", f"6' alloc+free {size_text(n)}, no cache", "us", ("<=", 1.0), k)
      for k, n, _ in ALLOCS),
    Row("7_open_stop_fresh", "7 open+stop, fresh process", "ms", ("ms<=", 40.0)),
    Row("7_open_stop_fresh_wall", "7 the fresh process, wall", "ms"),
    Row("7_open_stop_inproc", "7 open+stop again, same process", "ms", ("ms<=", 40.0)),
    Row("7_first_use_fresh", "7 open+load+launch+copy+stop, fresh", "ms", ("<=", 1.0)),
    Row("8_import", "8 import rig_nv_nvidia/torch/cupy", "ms"),
    *(Row(f"8_import_{m}", f"8 import {m}", "ms") for m in IMPORTS[:5]),
    Row("8_rig_list", "8 rig list (process wall)", "ms", ("ms<=", 150.0)),
    Row("8_rig_help", "8 rig --help (process wall)", "ms", ("ms<=", 150.0)),
    Row("8_python", "8 python -c pass (reference)", "ms"),
    Row("9_peer_01", "9 peer copy GPU0->GPU1 256 MiB", "GB/s", (">=", 0.9)),
    Row("9_peer_10", "9 peer copy GPU1->GPU0 256 MiB", "GB/s", (">=", 0.9)),
    Row("9_peer_01_ce", "9' GPU0->GPU1, copy engine", "GB/s", None, "9_peer_01"),
    Row("9_peer_01_sm", "9' GPU0->GPU1, SM kernels", "GB/s", None, "9_peer_01"),
    Row("9_peer_10_ce", "9' GPU1->GPU0, copy engine", "GB/s", None, "9_peer_10"),
    Row("9_peer_10_sm", "9' GPU1->GPU0, SM kernels", "GB/s", None, "9_peer_10"),
    *sweep_rows(),
    # Row 12 (issue 23): the same Triton cubin through rig and through Triton's own launcher
    # (cuLaunchKernelEx, in the torch column); torch.matmul is the ceiling (12').
    Row("12_matmul", "12 Triton fp16 matmul 8192^3", "TFLOP/s", (">=", 0.98), ref="torch"),
    Row("12_matmul_torch", "12' torch.matmul fp16 8192^3 (ceiling)", "TFLOP/s", ref="torch"),
    Row("11_wait_cpu", "11 CPU s per s of waiting", "CPU s/s", ("<=", 1.0)),
    # Rows 13 and 14 (issue 17): queues (rig) against streams (CUDA from C; torch's in its
    # column).
    Row("13_overlap", "13 1 GiB pinned upload beside 48 vadds: both / longer alone",
        "x", ("x<=", 1.1)),
    Row("13_overlap_upload", "13' the upload alone", "ms"),
    Row("13_overlap_kernels", "13' the kernels alone", "ms"),
    Row("13_overlap_both", "13' both, on two queues", "ms"),
    *(Row(f"14_threads_{n}", f"14 launches/s, {n} thread{'s' * (n > 1)} each on its own queue",
          "launches/s") for n in (1, 2, 4)),
)

NOTES = {
    "12_matmul": "bench/matmul.py compiled by the installed Triton; rig: rig_nv.triton; the "
    "torch column: the same source and options through Triton's own launcher "
    "(cuLaunchKernelEx), each worker's cubin digest in the JSON; each product waited for",
    "7_first_use_fresh": "what a user pays in a fresh process, imports left out: rig: open, "
    "load, launch vadd and wait, upload and download 4 KiB, stop; CUDA: cuInit, context, "
    "module, launch, cuMemcpy both ways, destroy",
    "13_overlap": "rig: copy on one d.queue() (engine='copy', pinned to Device) while a step "
    "of dependent vadds (48, ~20 ms alone) runs on another, both waited for; CUDA: "
    "cuMemcpyHtoDAsync from cuMemAllocHost memory on one non-blocking stream, the same vadds "
    "launched on another, both synchronized; torch: the copy on one torch.cuda.Stream, "
    "torch.add on another; a sample is wall(both) / max of the two alone, timed in the same "
    "round",
    "14_threads_1": "each thread launches vadd (rig, CUDA) or torch.add (torch) 20,000 times "
    "on a queue (stream) of its own, then waits for its own; CUDA: pthreads, the context "
    "current in each; wall time over all the launches",
    "11_wait_cpu": "the process's CPU seconds over the wall seconds of one wait for eight queued "
    "256 MiB D2D copies (CUDA: cuStreamSynchronize under CU_CTX_SCHED_AUTO)",
    "10_h2d_4k": "row 10: each copy waited for; rig's own engine choice (copy engine or SM "
    "kernels by size); 10 d2d ce / sm force rig's engine",
    "7_open_stop_fresh": "rig: gpu(0).open()+stop() after import; CUDA: cuInit+cuCtxCreate+"
    "cuCtxDestroy; torch/cupy: first CUDA use after import (context made, never destroyed)",
    "7_open_stop_fresh_wall": "whole process from exec to exit, interpreter and imports included",
    "6_alloc_64k": "torch and cupy: their caching allocators (no cudaMalloc after warm-up)",
    "6_alloc_64k_raw": "cupy.cuda.memory.Memory: cudaMalloc+cudaFree",
    "4_h2d_map_host": "rig only: map the caller's pages, copy, unmap, every time",
    "3_launch_flight": "plain launches (not steps/graphs) submitted, then one wait",
    "3_flight_queue": "rig only: a step of one vadd on a d.queue(), submit(times=10_000) then "
    "one wait, against CUDA's graph replays on its stream (row 3)",
    "9_peer_01": "rig: GPU 1's d1.copy from d1.map_peer(d0, r0) (GPU1->GPU0: into it), the "
    "better of engine='copy' and 'sm' (9'); CUDA: cuMemcpyPeerAsync on the source GPU's stream "
    "+ cuStreamSynchronize, primary contexts with peer access both ways; torch: tensor.to() "
    "the other GPU + synchronize both; n/a with fewer than two GPUs",
}


# ---- statistics ----------------------------------------------------------------------------


def summary(row: Row, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` holds samples_s (seconds per operation) and bytes: the value in the row's unit."""
    if "error" in data:
        return {"error": data["error"]}
    s = data.get("samples_s") or []
    if not s:
        return {"error": "no samples"}
    med, lo, hi = statistics.median(s), min(s), max(s)
    if row.stat == "p99":
        med = sorted(s)[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]
    elif row.stat == "max":
        med = hi
    if row.unit in ("CPU s/s", "x"):  # the samples are the values themselves
        return {"value": med, "min": lo, "max": hi, "n": len(s)}
    if row.unit == "launches/s":  # seconds per launch
        if lo <= 0:
            return {"error": "a sample of no time"}
        return {"value": 1 / med, "min": 1 / hi, "max": 1 / lo, "n": len(s)}
    if row.unit in ("GB/s", "TFLOP/s"):  # "bytes" holds the FLOPs of a TFLOP/s row
        b = (data.get("bytes") or 0) / (1e3 if row.unit == "TFLOP/s" else 1)
        if not b or lo <= 0:
            return {"error": "no byte count"}
        return {"value": b / med / 1e9, "min": b / hi / 1e9, "max": b / lo / 1e9, "n": len(s)}
    k = 1e6 if row.unit == "us" else 1e3
    return {"value": med * k, "min": lo * k, "max": hi * k, "n": len(s)}


def fmt(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "n/a"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def ratio_of(row: Row, rig: dict[str, Any], cuda: dict[str, Any]) -> float | None:
    r, c = rig.get("value"), cuda.get("value")
    if r is None or c is None or c == 0:
        return None
    return float(r / c)


def met(row: Row, rig: dict[str, Any], ratio: float | None) -> bool | None:
    if row.target is None:
        return None
    op, limit = row.target
    if op in ("ms<=", "x<="):  # rig's own value against the limit
        v = rig.get("value")
        return None if v is None else bool(v <= limit)
    if ratio is None:
        return None
    return ratio <= limit if op == "<=" else ratio >= limit


def target_text(row: Row) -> str:
    if row.target is None:
        return "-"
    op, limit = row.target
    if op == "ms<=":
        return f"<= {limit:g} ms"
    if op == "x<=":
        return f"<= {limit:g} (rig)"
    return f"{op} {limit}x" + ("" if row.ref == "cuda" else f" {row.ref}")


def summarise(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each row: every peer's value, min, max and samples; rig/CUDA and whether it met its
    target."""
    table: dict[str, Any] = {}
    for row in ROWS:
        entry: dict[str, Any] = {"label": row.label, "unit": row.unit,
                                 "target": target_text(row), "peers": {}}
        for peer in PEERS:
            rows = results.get(peer, {}).get("rows", {})
            if row.key == "2_per_kernel":
                t64, t1 = table["2_step64"]["peers"].get(peer), table["2_step1"]["peers"].get(peer)
                if t64 is None and t1 is None:
                    continue
                if t64 and t1 and "value" in t64 and "value" in t1:
                    stats: dict[str, Any] = {"value": (t64["value"] - t1["value"]) / 63,
                                             "min": None, "max": None, "n": 0}
                else:
                    stats = {"error": (t64 or {}).get("error") or (t1 or {}).get("error")}
            elif (row.source or row.key) in rows:
                stats = summary(row, rows[row.source or row.key])
                if "error" not in stats and row.source is None:
                    stats["raw"] = rows[row.key]
            else:
                continue
            entry["peers"][peer] = stats
        rig = entry["peers"].get("rig", {})
        if row.cuda_key and "cuda" not in entry["peers"] and row.cuda_key in table:
            # The CUDA row this one is measured against (shown in the CUDA column).
            entry["cuda_reference"] = row.cuda_key
            ref = table[row.cuda_key]["peers"].get("cuda")
            if ref is not None:
                entry["peers"]["cuda"] = {k: v for k, v in ref.items() if k != "raw"}
        cuda = entry["peers"].get("cuda", {})
        entry["ratio"] = ratio_of(row, rig, entry["peers"].get(row.ref, {}))
        entry["met"] = met(row, rig, entry["ratio"])
        entry["ratios"] = {p: ratio_of(row, entry["peers"].get(p, {}), cuda)
                           for p in ("rig", "torch", "cupy")}
        table[row.key] = entry
    return table


def combine(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds into one table: each peer's value the median of its rounds' values, with their
    min and max; rig's ratio the median of the rounds' ratios (each round's rig over the same
    round's reference), with their min and max; the target judged on those medians."""
    table: dict[str, Any] = {}
    for row in ROWS:
        per = [t[row.key] for t in tables if row.key in t]
        if not per:
            continue
        entry: dict[str, Any] = {k: per[-1][k] for k in ("label", "unit", "target")}
        entry["peers"] = {}
        for peer in PEERS:
            got = [e["peers"][peer] for e in per if peer in e["peers"]]
            values = [g["value"] for g in got if g.get("value") is not None]
            if values:
                entry["peers"][peer] = {"value": statistics.median(values), "min": min(values),
                                        "max": max(values), "rounds": values}
            elif got:
                entry["peers"][peer] = {"error": next((g.get("error") for g in got
                                                       if g.get("error")), "no value")}
        ratios = [e["ratio"] for e in per if e.get("ratio") is not None]
        entry["ratio"] = statistics.median(ratios) if ratios else None
        entry["ratio_min"] = min(ratios) if ratios else None
        entry["ratio_max"] = max(ratios) if ratios else None
        entry["ratio_rounds"] = ratios
        entry["met"] = met(row, entry["peers"].get("rig", {}), entry["ratio"])
        cuda = entry["peers"].get("cuda", {})
        entry["ratios"] = {p: ratio_of(row, entry["peers"].get(p, {}), cuda)
                           for p in ("rig", "torch", "cupy")}
        table[row.key] = entry
    return table


def selected_rows(rows: str | None) -> list[Row]:
    sel = rows.split(",") if rows else None
    return [r for r in ROWS if wanted(r.source or r.key, sel) or wanted(r.key, sel)]



def self_check() -> list[str]:
    """The arithmetic on three made-up rounds whose answers are known: what failed (empty when
    all holds). ``run.py --dry`` prints it; tests/test_bench.py plants bugs against it."""
    bad: list[str] = []

    def expect(what: str, got: Any, want: Any) -> None:
        close = (isinstance(got, float) and isinstance(want, float)
                 and math.isclose(got, want, rel_tol=1e-9))
        if not close and got != want:
            bad.append(f"{what}: got {got!r}, want {want!r}")

    us = 1e-6
    rounds = []
    for rig_us, cuda_us, d2d_s in ((10, 9, 0.2), (12, 10, 0.25), (11, 11, 0.1)):
        rounds.append({
            "rig": {"rows": {"1_launch": {"samples_s": [rig_us * us] * 90 + [20 * us] * 9
                                                          + [100 * us]},
                             "5_d2d": {"samples_s": [d2d_s], "bytes": 10**9},
                             "6_alloc_64k": {"samples_s": [3 * us]},
                             "13_overlap": {"samples_s": [1.05, 1.2, 1.0]},
                             "14_threads_2": {"samples_s": [2 * us]}}},
            "cuda": {"rows": {"1_launch": {"samples_s": [cuda_us * us] * 100},
                              "5_d2d": {"samples_s": [0.1], "bytes": 10**9},
                              "6_alloc_64k": {"samples_s": [50 * us]},
                              "13_overlap": {"samples_s": [1.5]},
                              "14_threads_2": {"samples_s": [4 * us]}}},
            "cupy": {"rows": {"6_alloc_64k": {"samples_s": [1 * us]}}},
            "torch": {"rows": {"13_overlap": {"samples_s": [1.0]},
                               "14_threads_2": {"samples_s": [1 * us]}}},
        })
    table = combine([summarise(r) for r in rounds])
    launch = table["1_launch"]
    expect("1_launch rig median of rounds", launch["peers"]["rig"]["value"], 11.0)
    expect("1_launch ratio, median of the rounds' ratios", launch["ratio"], 10 / 9)
    expect("1_launch ratio min", launch["ratio_min"], 1.0)
    expect("1_launch ratio max", launch["ratio_max"], 1.2)
    expect("1_launch target (<= 1.0x) missed", launch["met"], False)
    expect("1_launch_p99 rig", table["1_launch_p99"]["peers"]["rig"]["value"], 20.0)
    expect("1_launch_max rig", table["1_launch_max"]["peers"]["rig"]["value"], 100.0)
    d2d = table["5_d2d"]
    expect("5_d2d rig GB/s", d2d["peers"]["rig"]["value"], 5.0)
    expect("5_d2d ratio (bandwidth over bandwidth)", d2d["ratio"], 0.5)
    expect("5_d2d target (>= 0.95x) missed", d2d["met"], False)
    expect("6_alloc_64k ratio against cupy's pool", table["6_alloc_64k"]["ratio"], 3.0)
    expect("13_overlap rig, its own ratio", table["13_overlap"]["peers"]["rig"]["value"], 1.05)
    expect("13_overlap target (<= 1.1 of rig's own) met", table["13_overlap"]["met"], True)
    expect("13_overlap ratio against CUDA from C, not torch", table["13_overlap"]["ratio"], 0.7)
    expect("14_threads_2 launches/s", table["14_threads_2"]["peers"]["rig"]["value"], 5e5)
    expect("14_threads_2 ratio against CUDA from C (launches/s over launches/s)",
           table["14_threads_2"]["ratio"], 2.0)
    expect("14_threads_2 torch's column, its ratio to CUDA",
           table["14_threads_2"]["ratios"]["torch"], 4.0)
    for key, sel, want in (("1_launch", ["1"], True), ("10_h2d_4k", ["1"], False),
                           ("10_h2d_4k", ["10_h2d"], True), ("5_d2d", None, True),
                           ("1_launch", ["1_launch_p99"], False)):
        expect(f"wanted({key!r}, {sel!r})", wanted(key, sel), want)
    return bad
