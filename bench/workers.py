"""The bench's workers, each run in a process of its own by ``bench/run.py --worker NAME``:
rig, PyTorch and CuPy time every row they can and write the samples as JSON for run.py."""

from __future__ import annotations

import traceback
from pathlib import Path

from common import Recorder, log
from worker_peers import worker_cupy, worker_torch
from worker_rig import worker_rig

WORKERS = {"rig": worker_rig, "torch": worker_torch, "cupy": worker_cupy}


def worker(name: str, cubin: Path, scale: float, out: Path,
           rows: list[str] | None = None) -> int:
    rec = Recorder(scale, out, rows)
    status = 0
    try:
        WORKERS[name](rec, cubin)
    except Exception as e:
        rec.meta["error"] = f"{type(e).__name__}: {e}"
        rec.meta["traceback"] = traceback.format_exc(limit=8)
        log(f"{name}: {rec.meta['error']}")
        status = 1
    rec.save()
    return status
