"""The bench's method on the CPU (issue 23): its dry mode prints the rounds and rows it would
run and checks its own arithmetic; that arithmetic (median of the rounds' paired ratios, the
reference peer, p99 and max rows, the --rows rule) fails its self-check when planted wrong."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def rows() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("rows")
    finally:
        sys.path.remove(str(BENCH))


def dry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_dry_run_prints_alternating_rounds_and_checks_its_arithmetic() -> None:
    p = dry("--rounds", "4", "--peers", "rig,cuda")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "round 1: rig cuda" in p.stdout and "round 2: cuda rig" in p.stdout
    assert "round 4: cuda rig" in p.stdout
    assert "tree " in p.stdout and "UTC" in p.stdout
    assert "arithmetic: ok" in p.stdout


def test_rows_selects_by_key_or_prefix() -> None:
    p = dry("--rows", "5_d2d,10_h2d")
    assert p.returncode == 0, p.stdout + p.stderr
    listed = [ln.split()[0] for ln in p.stdout.splitlines() if ln.startswith("  ") and
              not ln.startswith("  round")]
    assert listed == ["5_d2d", *(f"10_h2d_{n}" for n in ("4k", "64k", "1m", "16m", "256m", "1g"))]


def test_rows_naming_nothing_is_refused() -> None:
    p = dry("--rows", "99")
    assert p.returncode == 2
    assert "--rows 99: names no row" in p.stderr


def test_cpus_pins_the_bench_and_its_peers_to_the_same_cpus() -> None:
    """--cpus: every peer's process on the same CPUs, said in the output; a list this process
    may not run on, or no list, is refused."""
    import os

    cpu = min(os.sched_getaffinity(0))
    p = dry("--rows", "1", "--cpus", str(cpu))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].endswith(f"on CPUs {cpu}"), p.stdout
    assert dry("--rows", "1").stdout.splitlines()[0].endswith("unpinned")
    far = max(os.sched_getaffinity(0)) + 1
    p = dry("--cpus", f"{cpu},{far}")
    assert p.returncode == 2 and f"CPUs [{far}] are not this process's" in p.stderr, p.stderr
    for bad, why in (("x", "is no CPU list"), ("3-1", "no CPUs in")):
        p = dry("--cpus", bad)
        assert p.returncode == 2 and f"--cpus {bad}: " in p.stderr and why in p.stderr, p.stderr


def test_self_check_holds(rows: ModuleType) -> None:
    assert rows.self_check() == []


@pytest.mark.parametrize("plant", ["ratio_of_medians", "ratio_against_cuda", "p99_is_median",
                                   "queue_rows_against_torch"])
def test_self_check_fails_on_a_planted_bug(rows: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                           plant: str) -> None:
    if plant == "ratio_of_medians":
        # The table's ratio taken as rig's median over the reference's median of rounds.
        real = rows.combine

        def combine(tables: list[dict[str, object]]) -> dict[str, object]:
            table = real(tables)
            for e in table.values():
                r, c = e["peers"].get("rig", {}), e["peers"].get("cuda", {})
                if r.get("value") and c.get("value"):
                    e["ratio"] = r["value"] / c["value"]
            return table

        monkeypatch.setattr(rows, "combine", combine)
    elif plant == "ratio_against_cuda":
        monkeypatch.setattr(rows.Row, "ref", "cuda")
        for r in rows.ROWS:
            object.__setattr__(r, "ref", "cuda")
    elif plant == "queue_rows_against_torch":
        # Rows 13 and 14 compared with torch's streams again, not with CUDA from C.
        for r in rows.ROWS:
            if r.key.startswith(("13_", "14_")):
                object.__setattr__(r, "ref", "torch")
    else:
        for r in rows.ROWS:
            if r.stat == "p99":
                object.__setattr__(r, "stat", "median")
    try:
        assert rows.self_check() != []
    finally:
        importlib.reload(rows)


def test_cuda_from_c_records_the_queue_rows_under_their_keys(rows: ModuleType) -> None:
    """Issue 23: rows 13 and 14 are compared against CUDA from C, so cuda_bench.c records
    every one of worker_queues.py's keys, and rows.py takes their ratios against "cuda"."""
    import worker_queues

    source = (BENCH / "cuda_bench.c").read_text()
    for key in (*worker_queues.OVERLAP_KEYS, *worker_queues.THREAD_KEYS):
        assert f'"{key}"' in source, key
        assert next(r for r in rows.ROWS if r.key == key).ref == "cuda", key


QUEUE_ROWS = """
import sys
from pathlib import Path

import numpy as np

root, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path[:0] = [str(root / "bench"), str(root / "packages" / "rig-nv" / "tests")]
import worker_queues as wq
from common import Recorder
from fake_gpu import open_fake

from rig_edge import Memory

wq.UPLOAD, wq.WORK = 1 << 16, 1 << 10
wq.same = lambda *a: None  # nothing runs on the stand-in: its bytes are not copied
rec = Recorder(0.001, out)
d, _ = open_fake()
try:
    fn = d.load((root / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin").read_bytes())["vadd"]
    wq.queues_rig(rec, d, np.random.default_rng(), lambda n, k=Memory.DEVICE: d.alloc(n, k),
                  lambda r: np.zeros(r.length, dtype=np.uint8), fn)
finally:
    d.stop()
"""


def test_queue_rows_run_on_the_stand_in(tmp_path: Path) -> None:
    """Rows 13 and 14 (issue 17) through rig's queues on the stand-in path, in a process of
    its own (the stand-in's memory lies at fixed addresses that the PCI path's tests reserve
    in theirs): every row gets its samples, no error; the overlap samples are ratios of the
    same round's times."""
    import json

    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "-c", QUEUE_ROWS, str(BENCH.parent), str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    keys = ("13_overlap", "13_overlap_upload", "13_overlap_kernels", "13_overlap_both",
            "14_threads_1", "14_threads_2", "14_threads_4")
    for key in keys:
        assert "error" not in rows[key], rows[key]
        assert len(rows[key]["samples_s"]) == 3
    both, up, k = (rows[f"13_overlap{s}"]["samples_s"] for s in ("_both", "_upload",
                                                                 "_kernels"))
    assert rows["13_overlap"]["samples_s"] == [b / max(u, x)
                                               for b, u, x in zip(both, up, k, strict=True)]


def test_the_table_shows_only_the_rows_asked_for(rows: ModuleType,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Row 3 replays row 2's graph, so the Python peers measure row 2 when --rows 3 asks for
    row 3 alone; the table still shows only what was asked (2026-12-03 23:43 showed row 2's
    lines, n/a for rig and CUDA)."""
    run = importlib.import_module("run")
    sample = {"samples_s": [2e-6, 3e-6, 4e-6], "bytes": 0}
    results = {peer: {"rows": {"3_flight": sample} | ({"2_step1": sample, "2_step64": sample}
                                                      if peer == "torch" else {})}
               for peer in ("rig", "cuda", "torch")}
    table = rows.combine([rows.summarise(results)])
    assert "2_step1" in table and table["2_step1"]["peers"]  # measured, so in the JSON
    run.print_table(table, {}, rows.selected_rows("3"))
    out = capsys.readouterr().out
    assert "3 10,000 1-kernel steps" in out
    assert "2 step of" not in out


def test_each_peers_process_follows_a_timing_of_the_hosts_python(
        rows: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A round times common.HOST_STMT before each peer's process and keeps it in that peer's
    meta; the run's last line gives each peer's min-max over the rounds: slow turns of the
    host (docs/results/ring-2026-12-04.txt) show beside the rows they moved."""
    import argparse

    run, common = importlib.import_module("run"), importlib.import_module("common")
    speeds = iter([2.5, 4.0, 3.0, 5.5])
    monkeypatch.setattr(run, "host_us", lambda: next(speeds))
    monkeypatch.setattr(run, "run_worker",
                        lambda peer, *_: {"meta": {"peer": peer}, "rows": {}})
    args = argparse.Namespace(rows="1", scale=0.5)
    rounds = [run.one_round(r, ["rig", "torch"], None, None, tmp_path, args, {}, tmp_path, {})
              for r in range(2)]
    assert [(r["rig"]["meta"]["host_us"], r["torch"]["meta"]["host_us"]) for r in rounds] == [
        (2.5, 4.0), (5.5, 3.0)]  # the second round runs torch first
    assert rounds[0]["rig"]["meta"]["peer"] == "rig"  # the worker's own meta kept
    assert common.host_line(rounds) == (
        "host's Python before each process (common.host_us, us): rig 2.50-5.50, torch 3.00-4.00")
    assert common.host_line([{"rig": {"meta": {}}}]) is None
    assert 0 < common.host_us() < 1e4
