"""What the bench's workers share: the row keys and sizes, the Recorder that keeps a worker's
samples (or the error that ended a row) as JSON, the --rows rule, timing loops and checks on
fresh random data."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

COPY = 256 << 20
FLIGHT = 10_000
# Row 6: allocation sizes and repetitions (issue 23: 64 KiB, 64 MiB and 1 GiB).
ALLOCS = (("6_alloc_64k", 64 << 10, 2000), ("6_alloc_64m", 64 << 20, 300),
          ("6_alloc_1g", 1 << 30, 20))
# Row 10: copy sizes, as cuda_bench.c's sweep_sizes and sweep_names.
SWEEP = (("4k", 4 << 10), ("64k", 64 << 10), ("1m", 1 << 20), ("16m", 16 << 20),
         ("256m", 256 << 20), ("1g", 1 << 30))
SWEEP_KINDS = ("h2d", "d2h", "d2d")
# Row 9 (issue 10): 256 MiB between GPU 0 and GPU 1, each way. rig times each engine as a row of
# its own (9') and reports the better one as 9; CUDA and torch have the two unprimed rows.
PEER_ROWS = ("9_peer_01", "9_peer_10")
PEER_ENGINES = (("copy", "ce"), ("sm", "sm"))  # rig's engine=, and the key's suffix
PEER_KEYS = (*PEER_ROWS, *(f"{k}_{tag}" for k in PEER_ROWS for _, tag in PEER_ENGINES))


def cpu_list(text: str) -> set[int]:
    """The CPUs ``text`` names as taskset's --cpu-list does ("4", "4-7,9"). Raises
    ValueError for any other form or an empty range."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"{text!r} is no CPU list (4, or 4-7,9)") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"no CPUs in {part!r}")
        cpus.update(range(lo, hi + 1))
    return cpus


def pin(text: str) -> None:
    """Pin this process, and so every process it starts (sched_setaffinity(2): children keep
    the mask), to the CPUs ``text`` names (:func:`cpu_list`): every peer runs where the
    others do (bench/README.md says what it changed on the H200's host). Raises ValueError
    for a list of no CPUs, or of CPUs this process may not run on."""
    cpus, allowed = cpu_list(text), os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ValueError(f"CPUs {sorted(cpus - allowed)} are not this process's to run on "
                         f"(those are {sorted(allowed)})")
    os.sched_setaffinity(0, cpus)


# A fixed piece of pure Python, timed by the harness before each peer's process: how fast the
# host runs Python just then. On the H200's host it takes 3.3 to 7.2 us from one moment to the
# next (docs/results/slow-turn-2026-12-04.txt), and rig's CPU-paced rows move with the host;
# one timing before a process does not predict its rounds.
HOST_STMT = "d = {}\nfor i in range(100):\n    d[i] = i + 1"


def host_us() -> float:
    """Microseconds :data:`HOST_STMT` takes here now, the best of five (timeit)."""
    number = 200
    return min(timeit.repeat(HOST_STMT, number=number, repeat=5)) / number * 1e6


def host_line(rounds: list[dict[str, dict[str, Any]]]) -> str | None:
    """A line of each peer's :func:`host_us` over the rounds (min-max), or None where no round
    has one."""
    spans = []
    for peer in ("rig", "cuda", "torch", "cupy"):
        us = [r[peer]["meta"]["host_us"] for r in rounds
              if "host_us" in r.get(peer, {}).get("meta", {})]
        if us:
            spans.append(f"{peer} {min(us):.2f}-{max(us):.2f}")
    if not spans:
        return None
    return "host's Python before each process (common.host_us, us): " + ", ".join(spans)


def sh(cmd: list[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def tree() -> str:
    """The commit benchmarked, with "+changes" where the working tree differs from it; or
    $RIG_TREE where set. (A copy of the tree on another machine may carry stale git data: the
    device tool's copies all said 41aeb7b on 2026-12-02.)"""
    if os.environ.get("RIG_TREE"):
        return os.environ["RIG_TREE"]
    root = str(Path(__file__).resolve().parents[1])
    try:
        head = sh(["git", "-C", root, "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = sh(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"])
    except (OSError, subprocess.SubprocessError):
        return "unknown tree"
    return (head or "unknown tree") + ("+changes" if dirty.stdout.strip() else "")


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---- shared by the workers -------------------------------------------------------------------


class Recorder:
    """A worker's rows: samples, or the error that ended the row."""

    def __init__(self, scale: float, path: Path, rows: list[str] | None = None) -> None:
        self.scale = scale
        self.path = path
        self.selection = rows
        self.rows: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {}

    def save(self) -> None:
        """Write what there is so far (a worker that is killed still leaves its rows)."""
        self.path.write_text(json.dumps({"meta": self.meta, "rows": self.rows}))

    def wants(self, *keys: str) -> bool:
        """Whether --rows asks for any of ``keys`` (or for a row derived from one)."""
        return any(wanted(k, self.selection, derived=True) for k in keys)

    def reps(self, n: int) -> int:
        return max(3, int(n * self.scale))

    def add(self, key: str, samples: list[float], nbytes: int = 0, **extra: Any) -> None:
        self.rows[key] = {"samples_s": samples, "bytes": nbytes, **extra}
        self.save()
        med, lo = statistics.median(samples), min(samples)
        if key.startswith("11_") or key == "13_overlap":  # a ratio, not a time
            log(f"  {key}: median {med:.3f}, min {lo:.3f} ({len(samples)} samples)")
        elif nbytes and key.split("_", maxsplit=1)[0] in ("4", "5", "9", "10"):  # the copy rows
            log(f"  {key}: median {nbytes / med / 1e9:.2f} GB/s, best {nbytes / lo / 1e9:.2f} "
                f"GB/s ({len(samples)} samples)")
        else:
            log(f"  {key}: median {med * 1e6:.2f} us, min {lo * 1e6:.2f} us "
                f"({len(samples)} samples)")

    @contextlib.contextmanager
    def row(self, *keys: str) -> Iterator[None]:
        """Run a row: an exception becomes the error of each of ``keys`` not yet recorded."""
        try:
            yield
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            tb = traceback.format_exc(limit=6)
            log(f"  {', '.join(keys)}: FAILED: {msg}")
            for k in keys:
                self.rows.setdefault(k, {"error": msg, "traceback": tb})
            self.save()

    def skip(self, keys: tuple[str, ...], why: str) -> None:
        """Rows that cannot run on this machine: n/a with the reason."""
        for k in keys:
            self.rows[k] = {"error": why, "skipped": True}
        log(f"  {', '.join(keys)}: n/a: {why}")
        self.save()


def wanted(key: str, selection: list[str] | None, derived: bool = False) -> bool:
    """Whether a --rows selection names ``key``: an item is a key ("5_d2d"), or a prefix of keys
    followed by an underscore ("1", "10_h2d"); None selects every row. With ``derived``, an
    item that begins with ``key`` and an underscore counts too ("1_launch_p99" needs
    "1_launch"). cuda_bench.c's wanted() and group_wanted() keep the same rule."""
    if selection is None:
        return True
    return any(key == item or key.startswith(item + "_")
               or (derived and item.startswith(key + "_")) for item in selection)


def too_few_gpus(count: int) -> str | None:
    """Why the peer rows cannot run with ``count`` GPUs, or None where they can."""
    if count >= 2:
        return None
    return "one GPU here" if count == 1 else f"{count} GPUs here, the peer rows need two"


def timed(fn: Callable[[], object], reps: int, warm: int) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(reps):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def flight(fn: Callable[[], object], wait: Callable[[], object], reps: int) -> list[float]:
    """FLIGHT calls of ``fn``, then ``wait()``: seconds per call, ``reps`` times after one
    warm-up round."""
    out = []
    clock = time.perf_counter
    for r in range(reps + 1):
        t = clock()
        for _ in range(FLIGHT):
            fn()
        wait()
        if r:
            out.append((clock() - t) / FLIGHT)
    return out


def flight_batched(submit: Callable[[int], Any], reps: int) -> list[float]:
    """``submit(FLIGHT)`` (FLIGHT submissions in one call), then a wait for the point it
    returns: seconds per submission, ``reps`` times after one warm-up round."""
    out = []
    clock = time.perf_counter
    for r in range(reps + 1):
        t = clock()
        submit(FLIGHT).wait()
        if r:
            out.append((clock() - t) / FLIGHT)
    return out


class Accumulator:
    """c += b, once per kernel, repeated on the host in float32 (the GPU's FADD rounds alike)."""

    def __init__(self, rng: Any) -> None:
        import numpy as np

        self.np = np
        self.c = np.float32(rng.random(dtype=np.float32) * np.float32(4))
        self.b = np.float32(rng.random(dtype=np.float32))
        self.count = 0

    def arrays(self) -> tuple[Any, Any]:
        np = self.np
        return np.array([self.c], dtype=np.float32), np.array([self.b], dtype=np.float32)

    def check(self, got: Any, what: str) -> None:
        np = self.np
        c, b = self.c, self.b
        for _ in range(self.count):
            c = np.float32(c + b)
        self.c, self.count = c, 0
        got = np.float32(got)
        if got.view(np.uint32) != c.view(np.uint32):
            raise AssertionError(f"{what}: the accumulator holds {got!r}, the host computed {c!r}")


def same(got: Any, want: Any, what: str) -> None:
    import numpy as np

    if not np.array_equal(got, want):
        bad = int(np.count_nonzero(got != want))
        raise AssertionError(f"{what}: {bad} bytes differ")


def fresh_bytes(rng: Any, n: int) -> Any:
    import numpy as np

    return np.frombuffer(bytearray(rng.bytes(n)), dtype=np.uint8)

