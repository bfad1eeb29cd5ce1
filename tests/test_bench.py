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


def test_self_check_holds(rows: ModuleType) -> None:
    assert rows.self_check() == []


@pytest.mark.parametrize("plant", ["ratio_of_medians", "ratio_against_cuda", "p99_is_median"])
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
    else:
        for r in rows.ROWS:
            if r.stat == "p99":
                object.__setattr__(r, "stat", "median")
    try:
        assert rows.self_check() != []
    finally:
        importlib.reload(rows)


def test_queue_rows_run_on_the_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows 13 and 14 (issue 17) through rig's queues on the stand-in path (nothing runs on
    it, so the upload's byte check is left out): every row gets its samples, no error; the
    overlap samples are ratios of the same round's times."""
    root = BENCH.parent
    sys.path[:0] = [str(BENCH), str(root / "packages" / "rig-nv" / "tests")]
    try:
        import numpy as np
        import worker_queues as wq
        from common import Recorder
        from fake_gpu import BASE, FakePath, open_on

        from rig_edge import Memory

        monkeypatch.setattr(wq, "UPLOAD", 1 << 16)
        monkeypatch.setattr(wq, "WORK", 1 << 10)
        monkeypatch.setattr(wq, "same", lambda *a: None)
        rec = Recorder(0.001, tmp_path / "rows.json")
        path = FakePath()
        path.next = BASE + (96 << 30)  # apart from any other stand-in of this process
        d = open_on(path)
        try:
            fn = d.load((root / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin")
                        .read_bytes())["vadd"]

            def host(region: object) -> object:
                return np.zeros(region.length, dtype=np.uint8)  # type: ignore[attr-defined]

            wq.queues_rig(rec, d, np.random.default_rng(), lambda n, k=Memory.DEVICE:
                          d.alloc(n, k), host, fn)
        finally:
            d.stop()
        for key in (*wq.OVERLAP_KEYS, *wq.THREAD_KEYS):
            assert "error" not in rec.rows[key], rec.rows[key]
            assert len(rec.rows[key]["samples_s"]) == 3
        both, up, k = (rec.rows[f"13_overlap{s}"]["samples_s"] for s in ("_both", "_upload",
                                                                         "_kernels"))
        assert rec.rows["13_overlap"]["samples_s"] == [b / max(u, x)
                                                       for b, u, x in zip(both, up, k, strict=True)]
    finally:
        del sys.path[:2]
