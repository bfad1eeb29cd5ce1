#!/usr/bin/env python3
"""rig against CUDA from C, PyTorch and CuPy on the same work (issues 7, 10 and 23).

    python3 bench/run.py [--rounds N] [--rows 1,5_d2d,10] [--scale F] [--peers rig,cuda,...]
    python3 bench/run.py --dry        # no GPU: the plan, and the arithmetic checked

Each round runs every peer once, each a full process (CUDA from C: bench/cuda_bench.c; the
Python peers: ``--worker NAME``), then the fresh-process rows; odd rounds run the peers in
reverse order. A row's value is the median of its rounds; rig's ratio is the median of the
rounds' ratios (rig over the reference peer of the same round), with their min and max
(bench/rows.py). Writes every sample and round to $OUT/bench.json (./bench-out without OUT),
the plots to $OUT/bench*.png (with matplotlib; bench/plots.py), and prints a table last with
the tree and date. A missing peer or a failed row shows as n/a, its error in the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import host_line, host_us, log, pin, sh, tree, wanted
from plots import plot, plot_latency, plot_sweep
from rows import (
    IMPORTS,
    NOTES,
    PEERS,
    Row,
    combine,
    fmt,
    selected_rows,
    self_check,
    summarise,
    target_text,
)
from workers import WORKERS, worker

ROOT = Path(__file__).resolve().parents[1]
CUBINS = ROOT / "packages" / "rig-nv" / "tests" / "cubins"
IMPORT_OF = {"rig": "rig_nv_nvidia", "torch": "torch", "cupy": "cupy"}


# ---- the harness -------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment with every package's src on PYTHONPATH (kept where already there)."""
    env = dict(os.environ)
    have = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    env["PYTHONPATH"] = os.pathsep.join(have + [p for p in srcs if p not in have])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


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
        tries += [[nvcc, "-O2", "-o", str(exe), str(src), *link, "-lpthread"] for link in links]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        for inc in cuda_include_dirs():
            tries += [[cc, "-O2", "-o", str(exe), str(src), f"-I{inc}", *link, "-lpthread"]
                      for link in links]
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


def run_cuda(exe: Path, cubin: Path, scale: float, rows: str | None = None) -> dict[str, Any]:
    t = time.perf_counter()
    try:
        p = sh([str(exe), str(cubin), "--scale", str(scale), *(["--rows", rows] if rows else [])],
               timeout=240)
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


FIRST_USE = """import json, time
import numpy as np
import rig_nv_nvidia
from rig_edge import Memory
cubin = open(CUBIN, "rb").read()
t0 = time.perf_counter()
d = rig_nv_nvidia.gpu(0).open()
fn = d.load(cubin)["vadd"]
r = d.alloc(4096, Memory.DEVICE)
d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
data = np.random.default_rng().bytes(4096)
d.upload(r, data).wait()
back = bytes(d.download(r))
d.stop()
t1 = time.perf_counter()
assert back == data, "first use: the copy came back changed"
print(json.dumps({"total_s": t1 - t0}))
"""


def first_use(peer: str, exe: Path | None, env: dict[str, str], reps: int, cubin: Path
              ) -> dict[str, Any]:
    """Row 7, what a user pays in a fresh process: open, load, a first launch, a first copy
    each way, stop (CUDA: the same through the driver API); imports left out."""
    if peer == "cuda":
        if exe is None:
            return {"error": "cuda_bench did not build"}
        cmd = [str(exe), "--first-use", str(cubin)]
    elif peer == "rig":
        cmd = [sys.executable, "-c", FIRST_USE.replace("CUBIN", repr(str(cubin)))]
    else:
        return {}
    samples = []
    for i in range(reps + 1):  # the first run warms the file cache
        got, _, error = run_json(cmd, 120, env)
        if got is None:
            return {"error": error}
        if i:
            samples.append(got["total_s"])
    return {"samples_s": samples}


def fresh_rows(peer: str, exe: Path | None, env: dict[str, str], reps: int, cubin: Path
               ) -> dict[str, dict[str, Any]]:
    """Row 7 in fresh processes: the time inside the process, and the process's wall time."""
    rows = {}
    first = first_use(peer, exe, env, reps, cubin)
    if first:
        rows["7_first_use_fresh"] = first
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
        return {**rows, "7_open_stop_fresh": {"error": error},
                "7_open_stop_fresh_wall": {"error": error}}
    return {**rows, "7_open_stop_fresh": {"samples_s": inner, "runs": details},
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


def print_table(table: dict[str, Any], meta: dict[str, Any], rows: list[Row]) -> None:
    """The table of ``rows`` (those --rows asked for: a peer may measure more, as row 2 for
    row 3's graph), a line each that has a value."""
    head = ("row", "rig", "CUDA-C", "torch", "cupy", "rig/ref", "min-max", "target")
    lines = []
    for row in rows:
        e = table.get(row.key)
        if not e or not e["peers"]:
            continue
        cells = [f"{row.label} [{row.unit}]"]
        for peer in PEERS:
            cells.append(fmt(e["peers"].get(peer, {}).get("value")))
        ratio = e["ratio"]
        cells.append("n/a" if ratio is None else f"{ratio:.3f}x")  # 0.946x is no 0.95x
        lo, hi = e.get("ratio_min"), e.get("ratio_max")
        cells.append("" if lo is None or hi is None else f"{lo:.2f}-{hi:.2f}")
        flag = {True: " met", False: " MISSED", None: ""}[e["met"]]
        cells.append(e["target"] + (flag if e["target"] != "-" else ""))
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines, strict=True)]

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    print()
    print(f"{meta.get('gpu') or '?'}, driver {meta.get('driver') or '?'}, {meta.get('date')}, "
          f"tree {meta.get('tree')}, {meta.get('rounds')} rounds, "
          f"{'CPUs ' + meta['cpus'] if meta.get('cpus') else 'unpinned'}; {meta.get('command')}")
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for cells in lines:
        print(line(cells))
    sys.stdout.flush()


def order_of(peers: list[str], round_no: int) -> list[str]:
    """Each round runs every peer once; odd rounds run them in reverse (A B, then B A), so no
    peer always runs just after another GPU process or first."""
    return list(peers) if round_no % 2 == 0 else list(reversed(peers))


def run_worker(peer: str, cubin: Path, args: argparse.Namespace, env: dict[str, str],
               out: Path) -> dict[str, Any]:
    """One Python peer's worker in a process of its own: its rows, or its error."""
    path = out / f"worker-{peer}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--cubin",
           str(cubin), "--scale", str(args.scale), "--json", str(path)]
    if args.rows:
        cmd += ["--rows", args.rows]
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
        result: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        result = {"meta": {}, "rows": {}}
    if err:
        result["meta"].setdefault("error", err)
    return result


def cuda_round(exe: Path, cubin: Path, args: argparse.Namespace, out: Path,
               meta: dict[str, Any]) -> dict[str, Any]:
    """CUDA from C once; should the driver refuse the committed cubin (nvcc 13.0), CUDA and
    CuPy run kernels.cu compiled here instead (meta["cuda_cubin"]), rig the committed one."""
    if "cuda_cubin" in meta:
        return run_cuda(exe, Path(meta["cuda_cubin"]), args.scale, args.rows)
    result = run_cuda(exe, cubin, args.scale, args.rows)
    err = str(result.get("rows", {}).get("1_launch", {}).get("error", ""))
    if "cuModuleLoadData" in err:
        log(f"the driver refused {cubin.name}; compiling kernels.cu here ...")
        cuda_cubin, why = local_cubin(out, cubin)
        if cuda_cubin is None:
            meta["cuda_cubin_error"] = why
        else:
            meta["cuda_cubin"] = str(cuda_cubin)
            result = run_cuda(exe, cuda_cubin, args.scale, args.rows)
            result.setdefault("meta", {})["first_try"] = err
    return result


def one_round(round_no: int, peers: list[str], exe: Path | None, build_error: str | None,
              cubin: Path, args: argparse.Namespace, env: dict[str, str], out: Path,
              meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every peer once, in this round's order, each a full process; then the fresh-process
    rows (one process per peer) and the import rows."""
    results: dict[str, dict[str, Any]] = {p: {"meta": {}, "rows": {}} for p in PEERS}
    order = order_of(peers, round_no)
    log(f"round {round_no + 1}: {' '.join(order)}")
    for peer in order:
        speed = host_us()
        if peer == "cuda":
            if exe is None:
                results["cuda"]["meta"]["error"] = build_error or "cuda_bench did not build"
            else:
                log("CUDA from C ...")
                results["cuda"] = cuda_round(exe, cubin, args, out, meta)
        elif peer in PEERS:
            log(f"{peer} ...")
            use = Path(meta["cuda_cubin"]) if peer == "cupy" and "cuda_cubin" in meta else cubin
            results[peer] = run_worker(peer, use, args, env, out)
        results[peer].setdefault("meta", {})["host_us"] = round(speed, 2)
    sel = args.rows.split(",") if args.rows else None
    if wanted("7", sel):
        for peer in order:
            if peer in PEERS:
                log(f"{peer}: fresh processes ...")
                results[peer]["rows"].update(fresh_rows(peer, exe, env, 1, cubin))
    if wanted("8", sel):
        for peer, rows in import_rows(peers, env, 1).items():
            results[peer]["rows"].update(rows)
    return results


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
        "tree": tree(),
        "gpu": parts[0] if parts and parts[0] else None,
        "driver": parts[1] if len(parts) > 1 else None,
        "memory": parts[2] if len(parts) > 2 else None,
        "gpu_count": nvidia_smi("count"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cubin": str(cubin.relative_to(ROOT) if cubin.is_relative_to(ROOT) else cubin),
        "scale": args.scale,
        "rounds": args.rounds,
        "rows": args.rows,
        "cpus": args.cpus,
        "notes": NOTES,
    }
    exe, build_error = None, None
    if "cuda" in peers:
        log("building cuda_bench ...")
        exe, attempts = build(out)
        meta["build"] = attempts
        if exe is None:
            build_error = "cuda_bench did not build: " + (
                attempts[-1].get("output") or attempts[-1].get("error", "?"))[-800:]
            log(build_error)
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        rounds.append(one_round(r, peers, exe, build_error, cubin, args, env, out, meta))
        # Each round is kept as it ends: a run stopped at its limit still leaves its rounds.
        (out / "rounds.json").write_text(json.dumps({"meta": meta, "rounds": rounds},
                                                    indent=1, default=str))
        log(f"round {r + 1} done, {time.perf_counter() - started:.0f} s")
    table = combine([summarise(res) for res in rounds])
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["peers"] = {p: rounds[-1][p].get("meta", {}) for p in PEERS}
    meta["plot"] = plot(table, out / "bench.png")
    meta["plots"] = [plot_sweep(table, out / "bench-sweep.png"),
                     plot_latency(rounds, out / "bench-latency.png")]
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": table, "rounds": rounds},
                                               indent=1, default=str))
    for peer in PEERS:
        if meta["peers"][peer].get("error"):
            log(f"{peer}: {meta['peers'][peer]['error'][:300]}")
    log(f"wrote {out / 'bench.json'}; plots: {meta['plot']}, {meta['plots']}; "
        f"{meta['seconds']} s")
    print_table(table, meta, selected_rows(args.rows))
    host = host_line(rounds)
    if host:
        print(host)
    return 0


def dry(args: argparse.Namespace, peers: list[str]) -> int:
    """No GPU: the rows and rounds a run would make, then the arithmetic checked on made-up
    rounds. Exit 1 where a check fails."""
    rows = selected_rows(args.rows)
    where = "unpinned"
    if args.cpus:
        where = "on CPUs " + ",".join(map(str, sorted(os.sched_getaffinity(0))))
    print(f"dry run, tree {tree()}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}: "
          f"{args.rounds} rounds, each a full process per peer, {where}")
    for r in range(args.rounds):
        print(f"  round {r + 1}: {' '.join(order_of(peers, r))}")
    print(f"{len(rows)} rows:")
    for row in rows:
        ref = row.ref if row.cuda_key is None else f"{row.ref} ({row.cuda_key})"
        print(f"  {row.key:<24} {row.label} [{row.unit}], against {ref}, target "
              f"{target_text(row)}")
    bad = self_check()
    for line in bad:
        print(f"arithmetic: FAILED: {line}")
    print("arithmetic: ok" if not bad else f"arithmetic: {len(bad)} checks failed")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every repetition count")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated: rig,cuda,torch,cupy")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds, each running every peer once, in alternating order")
    ap.add_argument("--rows", help="comma-separated row keys or prefixes (1,5_d2d,10_h2d)")
    ap.add_argument("--dry", action="store_true",
                    help="no GPU: print the plan and check the arithmetic")
    ap.add_argument("--cubin", help="the cubin (default: kernels.sm_XY.cubin of GPU 0)")
    ap.add_argument("--cpus", help="pin the bench and so every peer's process to these CPUs, "
                    "the same for all (4, or 4-7,9); row 14 wants one a thread")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale <= 0:
        ap.error("--scale must be positive")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        ap.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)})")
    if args.rows and not selected_rows(args.rows):
        ap.error(f"--rows {args.rows}: names no row (run --dry for the list)")
    if args.cpus:
        try:
            pin(args.cpus)
        except ValueError as e:
            ap.error(f"--cpus {args.cpus}: {e}")
    if args.worker:
        return worker(args.worker, Path(args.cubin), args.scale, Path(args.json),
                      args.rows.split(",") if args.rows else None)
    if args.dry:
        return dry(args, peers)
    return harness(args)


if __name__ == "__main__":
    sys.exit(main())
