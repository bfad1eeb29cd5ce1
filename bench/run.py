#!/usr/bin/env python3
"""rig against CUDA from C, PyTorch and CuPy on the same work, in one run (issues 7 and 10).

    python3 bench/run.py [--scale F] [--peers rig,cuda,torch,cupy]

Rows 1-8 run on GPU 0 (issue 7); row 9 copies between GPUs 0 and 1 (issue 10), n/a where the
machine has one GPU. Builds bench/cuda_bench.c (nvcc, else cc -lcuda), runs it, then each Python
peer in a process of its own (``--worker NAME``), then the fresh-process rows (open+stop, import
times, ``rig list``).
Every row is the median of many repetitions after warm-up, with min and max; every copy and
kernel row checks its result against fresh random data before it counts. Writes every sample to
$OUT/bench.json (./bench-out without OUT), the rig/CUDA ratios to $OUT/bench.png (with
matplotlib), and prints a table last. A peer that is missing or a row that fails is recorded in
the JSON and shown as n/a.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers import WORKERS, log, worker

ROOT = Path(__file__).resolve().parents[1]
CUBINS = ROOT / "packages" / "rig-nv" / "tests" / "cubins"
PEERS = ("rig", "cuda", "torch", "cupy")
IMPORTS = ("rig_edge", "rig_pci", "rig_nv", "rig_nv_nvidia", "rig_cli", "torch", "cupy")
IMPORT_OF = {"rig": "rig_nv_nvidia", "torch": "torch", "cupy": "cupy"}


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str  # "us", "ms" (times: lower is better) or "GB/s" (higher is better)
    target: tuple[str, float] | None = None  # ("<=" | ">=", ratio to CUDA) or ("ms<=", ms)
    cuda_key: str | None = None  # the CUDA row to compare with, where not the same key


ROWS = (
    Row("1_launch", "1 launch+wait, 1 kernel", "us", ("<=", 1.0)),
    Row("2_step64", "2 step of 64 dependent kernels", "us", ("<=", 1.0)),
    Row("2_step1", "2 step of 1 kernel", "us", ("<=", 1.0)),
    Row("2_per_kernel", "2 each further kernel (t64-t1)/63", "us", ("<=", 1.0)),
    Row("3_flight", "3 10,000 1-kernel steps, per step", "us", ("<=", 1.0)),
    Row("3_launch_flight", "3' 10,000 launches, per launch", "us"),
    Row("4_h2d_pinned", "4 H2D 256 MiB pinned", "GB/s", (">=", 0.98)),
    Row("4_d2h_pinned", "4 D2H 256 MiB pinned", "GB/s", (">=", 0.98)),
    Row("4_h2d_pageable", "4 H2D 256 MiB pageable", "GB/s", (">=", 1.5)),
    Row("4_d2h_pageable", "4 D2H 256 MiB pageable", "GB/s", (">=", 1.5)),
    Row("4_h2d_map_host", "4' H2D pageable, map_host+copy+free", "GB/s", (">=", 1.5),
        "4_h2d_pageable"),
    Row("4_d2h_map_host", "4' D2H pageable, map_host+copy+free", "GB/s", (">=", 1.5),
        "4_d2h_pageable"),
    Row("5_d2d", "5 D2D 256 MiB", "GB/s", (">=", 0.9)),
    Row("6_alloc_64k", "6 alloc+free 64 KiB", "us", ("<=", 1.0)),
    Row("6_alloc_64m", "6 alloc+free 64 MiB", "us", ("<=", 1.0)),
    Row("6_alloc_64k_raw", "6' alloc+free 64 KiB, no cache", "us", None, "6_alloc_64k"),
    Row("6_alloc_64m_raw", "6' alloc+free 64 MiB, no cache", "us", None, "6_alloc_64m"),
    Row("7_open_stop_fresh", "7 open+stop, fresh process", "ms", ("ms<=", 40.0)),
    Row("7_open_stop_fresh_wall", "7 the fresh process, wall", "ms"),
    Row("7_open_stop_inproc", "7 open+stop again, same process", "ms", ("ms<=", 40.0)),
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
)

NOTES = {
    "7_open_stop_fresh": "rig: gpu(0).open()+stop() after import; CUDA: cuInit+cuCtxCreate+"
    "cuCtxDestroy; torch/cupy: first CUDA use after import (context made, never destroyed)",
    "7_open_stop_fresh_wall": "whole process from exec to exit, interpreter and imports included",
    "6_alloc_64k": "torch and cupy: their caching allocators (no cudaMalloc after warm-up)",
    "6_alloc_64k_raw": "cupy.cuda.memory.Memory: cudaMalloc+cudaFree",
    "4_h2d_map_host": "rig only: map the caller's pages, copy, unmap, every time",
    "3_launch_flight": "plain launches (not steps/graphs) submitted, then one wait",
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
    if row.unit == "GB/s":
        b = data.get("bytes") or 0
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


# ---- the harness -------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment with every package's src on PYTHONPATH (kept where already there)."""
    env = dict(os.environ)
    have = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    env["PYTHONPATH"] = os.pathsep.join(have + [p for p in srcs if p not in have])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def sh(cmd: list[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def nvidia_smi(query: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        p = sh([exe, f"--query-gpu={query}", "--format=csv,noheader", "-i", "0"])
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def pick_cubin() -> Path:
    cap = nvidia_smi("compute_cap")
    if cap and "." in cap:
        path = CUBINS / f"kernels.sm_{cap.replace('.', '')}.cubin"
        if path.exists():
            return path
    return CUBINS / "kernels.sm_90.cubin"


def cuda_include_dirs() -> list[str]:
    """Folders with cuda.h: the toolkit's, the system's, or a Python package's (triton ships
    one)."""
    dirs = []
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base:
            dirs.append(f"{base}/include")
    dirs.append("/usr/include")
    for p in sys.path:
        sp = Path(p)
        if sp.is_dir():
            dirs += [str(h.parent) for h in sp.glob("triton/backends/nvidia/include/cuda.h")]
            dirs += [str(h.parent) for h in sp.glob("nvidia/cuda_runtime/include/cuda.h")]
    return [d for d in dict.fromkeys(dirs) if Path(d, "cuda.h").exists()]


def libcuda_args() -> list[list[str]]:
    """Ways to link the driver library: -lcuda, else the driver's libcuda.so.1 by path."""
    ways = [["-lcuda"]]
    for d in ("/usr/local/cuda/lib64/stubs", "/usr/local/cuda/lib64"):
        if Path(d, "libcuda.so").exists():
            ways.append([f"-L{d}", "-lcuda"])
    try:
        listed = sh(["ldconfig", "-p"]).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    for line in listed.splitlines():
        if "libcuda.so.1 " in line and "x86-64" in line and "=>" in line:
            ways.append([line.split("=>")[1].strip()])
    ways += [[p] for p in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1")
             if Path(p).exists()]
    unique: list[list[str]] = []
    for w in ways:
        if w not in unique:
            unique.append(w)
    return unique


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None)


def local_cubin(out: Path, cubin: Path) -> tuple[Path | None, str]:
    """kernels.cu compiled here, for a driver older than the committed cubin's nvcc (13.0)."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None, "no nvcc"
    arch = cubin.name.split(".")[1]  # kernels.sm_90.cubin
    dst = out / f"kernels.{arch}.local.cubin"
    try:
        p = sh([nvcc, "-cubin", f"-arch={arch}", "-o", str(dst), str(CUBINS / "kernels.cu")],
               timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{type(e).__name__}: {e}"
    return (dst, "") if p.returncode == 0 else (None, (p.stderr or p.stdout)[-800:])


def build(out: Path) -> tuple[Path | None, list[dict[str, Any]]]:
    src, exe = ROOT / "bench" / "cuda_bench.c", out / "cuda_bench"
    tries: list[list[str]] = []
    nvcc = find_nvcc()
    links = libcuda_args()
    if nvcc:
        tries += [[nvcc, "-O2", "-o", str(exe), str(src), *link] for link in links]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        for inc in cuda_include_dirs():
            tries += [[cc, "-O2", "-o", str(exe), str(src), f"-I{inc}", *link] for link in links]
    attempts: list[dict[str, Any]] = []
    for cmd in tries:
        try:
            p = sh(cmd, timeout=120)
            attempts.append({"cmd": " ".join(cmd), "rc": p.returncode,
                             "output": (p.stdout + p.stderr)[-2000:]})
        except (OSError, subprocess.SubprocessError) as e:
            attempts.append({"cmd": " ".join(cmd), "error": f"{type(e).__name__}: {e}"})
            continue
        if p.returncode == 0:
            return exe, attempts
    if not tries:
        attempts.append({"error": "neither nvcc nor cc found"})
    return None, attempts


def run_json(cmd: list[str], timeout: float, env: dict[str, str] | None = None
             ) -> tuple[dict[str, Any] | None, float, str]:
    """Run ``cmd``; its stdout's last line as JSON, its wall seconds, and an error (or "")."""
    t = time.perf_counter()
    try:
        p = sh(cmd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t, f"timed out after {timeout} s"
    except OSError as e:
        return None, time.perf_counter() - t, f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return None, wall, f"exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}"
    try:
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        return json.loads(lines[-1]), wall, ""
    except (ValueError, IndexError):
        return None, wall, f"no JSON in its output: {p.stdout[-500:]} {p.stderr[-500:]}"


def run_cuda(exe: Path, cubin: Path, scale: float) -> dict[str, Any]:
    log("CUDA from C ...")
    t = time.perf_counter()
    try:
        p = sh([str(exe), str(cubin), "--scale", str(scale)], timeout=240)
    except (OSError, subprocess.SubprocessError) as e:
        return {"meta": {"error": f"cuda_bench did not run: {type(e).__name__}: {e}"},
                "rows": {}}
    if p.stderr:
        log(p.stderr.rstrip()[-3000:])
    try:
        result: dict[str, Any] = json.loads(p.stdout)
    except ValueError:
        return {"meta": {"error": f"cuda_bench exit {p.returncode}, no JSON: "
                         f"{(p.stderr or p.stdout)[-1500:]}"}, "rows": {}}
    log(f"  done in {time.perf_counter() - t:.1f} s, exit {p.returncode}")
    return result


def fresh_rows(peer: str, exe: Path | None, env: dict[str, str], reps: int
               ) -> dict[str, dict[str, Any]]:
    """Row 7 in fresh processes: the time inside the process, and the process's wall time."""
    scripts = {
        "rig": "import json, time\nt0 = time.perf_counter()\nimport rig_nv_nvidia\n"
               "t1 = time.perf_counter()\nd = rig_nv_nvidia.gpu(0).open()\n"
               "t2 = time.perf_counter()\nd.stop()\nt3 = time.perf_counter()\n"
               "print(json.dumps({'import_s': t1 - t0, 'open_s': t2 - t1, 'stop_s': t3 - t2,"
               " 'total_s': t3 - t1}))",
        "torch": "import json, time\nimport torch\nt1 = time.perf_counter()\n"
                 "x = torch.zeros(1, device='cuda')\ntorch.cuda.synchronize()\n"
                 "print(json.dumps({'total_s': time.perf_counter() - t1}))",
        "cupy": "import json, time\nimport cupy\nt1 = time.perf_counter()\n"
                "x = cupy.zeros(1)\ncupy.cuda.runtime.deviceSynchronize()\n"
                "print(json.dumps({'total_s': time.perf_counter() - t1}))",
    }
    if peer == "cuda":
        if exe is None:
            return {}
        cmd = [str(exe), "--ctx-once"]
    else:
        cmd = [sys.executable, "-c", scripts[peer]]
    inner, walls, details, error = [], [], [], ""
    for i in range(reps + 1):  # the first run warms the file cache
        got, wall, error = run_json(cmd, 120, env)
        if got is None:
            break
        if i:
            inner.append(got["total_s"])
            walls.append(wall)
            details.append(got)
    if error:
        return {"7_open_stop_fresh": {"error": error}, "7_open_stop_fresh_wall": {"error": error}}
    return {"7_open_stop_fresh": {"samples_s": inner, "runs": details},
            "7_open_stop_fresh_wall": {"samples_s": walls}}


def wall_rows(cmd: list[str], env: dict[str, str], reps: int, inner: bool
              ) -> dict[str, Any]:
    """A process run ``reps`` times after one warm-up: its printed seconds (``inner``) or its
    wall time."""
    samples = []
    for i in range(reps + 1):
        t = time.perf_counter()
        try:
            p = sh(cmd, timeout=120, env=env)
        except (OSError, subprocess.SubprocessError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        wall = time.perf_counter() - t
        if p.returncode != 0:
            return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-1000:]}"}
        if i and not inner:
            samples.append(wall)
        elif i:
            try:
                samples.append(float(p.stdout.split()[-1]))
            except (ValueError, IndexError):
                return {"error": f"no time in its output: {p.stdout[-300:]!r}"}
    return {"samples_s": samples}


def import_rows(peers: list[str], env: dict[str, str], reps: int
                ) -> dict[str, dict[str, dict[str, Any]]]:
    rows: dict[str, dict[str, dict[str, Any]]] = {"rig": {}, "torch": {}, "cupy": {}}
    for module in IMPORTS:
        peer = module if module in ("torch", "cupy") else "rig"
        if peer not in peers:
            continue
        log(f"import {module} ...")
        code = f"import time; t = time.perf_counter(); import {module}; " \
               f"print(time.perf_counter() - t)"
        got = wall_rows([sys.executable, "-c", code], env, reps, inner=True)
        if peer == "rig":
            rows["rig"][f"8_import_{module}"] = got
        if module == IMPORT_OF[peer]:
            rows[peer]["8_import"] = got
    if "rig" in peers:
        log("rig list, rig --help ...")
        rows["rig"]["8_rig_list"] = wall_rows([sys.executable, "-m", "rig_cli", "list"], env,
                                              reps, inner=False)
        rows["rig"]["8_rig_help"] = wall_rows([sys.executable, "-m", "rig_cli", "--help"], env,
                                              reps, inner=False)
        rows["rig"]["8_python"] = wall_rows([sys.executable, "-c", "pass"], env, reps,
                                            inner=False)
    return rows


def ratio_of(row: Row, rig: dict[str, Any], cuda: dict[str, Any]) -> float | None:
    r, c = rig.get("value"), cuda.get("value")
    if r is None or c is None or c == 0:
        return None
    return float(r / c)


def met(row: Row, rig: dict[str, Any], ratio: float | None) -> bool | None:
    if row.target is None:
        return None
    op, limit = row.target
    if op == "ms<=":
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
    return f"{op} {limit}x"


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
            elif row.key in rows:
                stats = summary(row, rows[row.key])
                if "error" not in stats:
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
        entry["ratio"] = ratio_of(row, rig, cuda)
        entry["met"] = met(row, rig, entry["ratio"])
        entry["ratios"] = {p: ratio_of(row, entry["peers"].get(p, {}), cuda)
                           for p in ("rig", "torch", "cupy")}
        table[row.key] = entry
    return table


def print_table(table: dict[str, Any], meta: dict[str, Any]) -> None:
    head = ("row", "rig", "CUDA-C", "torch", "cupy", "rig/CUDA", "target")
    lines = []
    for row in ROWS:
        e = table[row.key]
        if not e["peers"]:
            continue
        cells = [f"{row.label} [{row.unit}]"]
        for peer in PEERS:
            cells.append(fmt(e["peers"].get(peer, {}).get("value")))
        ratio = e["ratio"]
        cells.append("n/a" if ratio is None else f"{ratio:.2f}x")
        flag = {True: " met", False: " MISSED", None: ""}[e["met"]]
        cells.append(e["target"] + (flag if e["target"] != "-" else ""))
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines, strict=True)]

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    print()
    print(f"{meta.get('gpu') or '?'}, driver {meta.get('driver') or '?'}, {meta.get('date')}; "
          f"{meta.get('command')}")
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for cells in lines:
        print(line(cells))
    sys.stdout.flush()


def plot(table: dict[str, Any], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: {e}"
    rows = [r for r in ROWS if any(v is not None for v in table[r.key]["ratios"].values())]
    if not rows:
        return "no plot: no ratios"
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    colours = {"rig": "tab:blue", "torch": "tab:orange", "cupy": "tab:green"}
    height = 0.27
    for i, peer in enumerate(("rig", "torch", "cupy")):
        ys, xs = [], []
        for j, r in enumerate(rows):
            v = table[r.key]["ratios"].get(peer)
            if v is not None and v > 0:
                ys.append(j + (i - 1) * height)
                xs.append(v)
        if xs:
            ax.barh(ys, xs, height=height, color=colours[peer], label=f"{peer} / CUDA-C")
    for j, r in enumerate(rows):
        if r.target and r.target[0] in ("<=", ">="):
            ax.plot([r.target[1]] * 2, [j - 0.45, j + 0.45], color="black", lw=2)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r.label} ({'higher' if r.unit == 'GB/s' else 'lower'} is better)"
                        for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to CUDA from C (black: target)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def harness(args: argparse.Namespace) -> int:
    out = Path(os.environ.get("OUT") or "./bench-out")
    out.mkdir(parents=True, exist_ok=True)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    env = child_env()
    cubin = Path(args.cubin) if args.cubin else pick_cubin()
    started = time.perf_counter()
    smi = nvidia_smi("name,driver_version,memory.total") or ""
    parts = [p.strip() for p in smi.split(",")]
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": parts[0] if parts and parts[0] else None,
        "driver": parts[1] if len(parts) > 1 else None,
        "memory": parts[2] if len(parts) > 2 else None,
        "gpu_count": nvidia_smi("count"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cubin": str(cubin.relative_to(ROOT) if cubin.is_relative_to(ROOT) else cubin),
        "scale": args.scale,
        "notes": NOTES,
    }
    try:
        meta["commit"] = sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        meta["commit"] = None
    results: dict[str, dict[str, Any]] = {p: {"meta": {}, "rows": {}} for p in PEERS}
    exe = None

    if "cuda" in peers:
        log("building cuda_bench ...")
        exe, attempts = build(out)
        meta["build"] = attempts
        if exe is None:
            results["cuda"]["meta"]["error"] = "cuda_bench did not build: " + (
                attempts[-1].get("output") or attempts[-1].get("error", "?"))[-800:]
            log(results["cuda"]["meta"]["error"])
        else:
            results["cuda"] = run_cuda(exe, cubin, args.scale)
            err = str(results["cuda"].get("rows", {}).get("1_launch", {}).get("error", ""))
            if "cuModuleLoadData" in err:
                # The driver refuses the committed cubin (nvcc 13.0): CUDA and CuPy run the
                # same kernels.cu compiled here instead; rig keeps the committed cubin.
                log(f"the driver refused {cubin.name}; compiling kernels.cu here ...")
                cuda_cubin, why = local_cubin(out, cubin)
                if cuda_cubin is None:
                    meta["cuda_cubin_error"] = why
                else:
                    again = run_cuda(exe, cuda_cubin, args.scale)
                    again.setdefault("meta", {})["first_try"] = err
                    results["cuda"] = again
                    meta["cuda_cubin"] = str(cuda_cubin)

    for peer in ("rig", "torch", "cupy"):
        if peer not in peers:
            continue
        log(f"{peer} ...")
        path = out / f"worker-{peer}.json"
        path.unlink(missing_ok=True)
        use = Path(meta["cuda_cubin"]) if peer == "cupy" and "cuda_cubin" in meta else cubin
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--cubin",
               str(use), "--scale", str(args.scale), "--json", str(path)]
        t = time.perf_counter()
        try:
            p = sh(cmd, timeout=240, env=env)
            tail = (p.stderr or "")[-6000:]
            err = "" if p.returncode == 0 else f"worker exit {p.returncode}: {tail[-1500:]}"
        except subprocess.TimeoutExpired as e:
            raw = e.stderr or b""
            tail = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)[-6000:]
            err = "worker timed out after 240 s"
        log(tail.rstrip())
        log(f"  done in {time.perf_counter() - t:.1f} s")
        try:
            results[peer] = json.loads(path.read_text())
        except (OSError, ValueError):
            results[peer] = {"meta": {}, "rows": {}}
        if err:
            results[peer]["meta"].setdefault("error", err)

    reps = max(3, int(5 * args.scale))
    for peer in peers:
        if peer in PEERS:
            log(f"{peer}: open+stop in fresh processes ...")
            results[peer]["rows"].update(fresh_rows(peer, exe, env, reps))
    for peer, rows in import_rows(peers, env, reps).items():
        results[peer]["rows"].update(rows)

    table = summarise(results)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["peers"] = {p: results[p].get("meta", {}) for p in PEERS}
    meta["plot"] = plot(table, out / "bench.png")
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": table}, indent=1,
                                               default=str))
    for peer in PEERS:
        if results[peer].get("meta", {}).get("error"):
            log(f"{peer}: {results[peer]['meta']['error'][:300]}")
    log(f"wrote {out / 'bench.json'}; plot: {meta['plot']}; {meta['seconds']} s")
    print_table(table, meta)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every repetition count")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated: rig,cuda,torch,cupy")
    ap.add_argument("--cubin", help="the cubin (default: kernels.sm_XY.cubin of GPU 0)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale <= 0:
        ap.error("--scale must be positive")
    if args.worker:
        return worker(args.worker, Path(args.cubin), args.scale, Path(args.json))
    return harness(args)


if __name__ == "__main__":
    sys.exit(main())
