"""Probe (issue 23, rows 1 and 3): whether a process's plain Python slows once it opens the
GPU, or the host's turn slows every process alike.

Fresh processes, one after another, alternating: ``rig`` times a fixed piece of plain Python
(bench/common.py's HOST_STMT, best of five) before the open, after it, after 10,000 one-kernel
steps submitted one at a time (row 3's shape, their per-step time too) and after the stop;
``plain`` times the same at the same moments with no GPU opened (a sleep for the open). A
table last, a line per process.

    python3 scripts/slow_turn_probe.py [processes]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import host_us  # noqa: E402

CUBIN = ROOT / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
FLIGHT = 10_000


def one(kind: str) -> None:
    marks = [host_us()]
    if kind == "plain":
        time.sleep(0.3)
        marks.append(host_us())
        time.sleep(0.05)
        marks += [host_us(), 0.0, host_us()]
    else:
        import rig_nv_nvidia
        d = rig_nv_nvidia.gpu(0).open()
        marks.append(host_us())
        fn = d.load(CUBIN.read_bytes())["vadd"]
        rc = d.alloc(4096)
        st = d.step()
        st.launch(fn, (1,), (1,), (rc, rc, rc, 1))
        st.submit().wait()
        submit = st.submit
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(FLIGHT):
                submit()
            d.synchronize()
            best = min(best, (time.perf_counter() - t) / FLIGHT * 1e6)
        marks += [host_us(), best]
        d.stop()
        marks.append(host_us())
    print("\t".join(f"{m:.2f}" for m in marks))


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2])
        return
    n = int(sys.argv[1]) if sys.argv[1:] else 12
    print(f"{'process':<10} {'before':>7} {'opened':>7} {'after':>7} {'step us':>8} "
          f"{'stopped':>8}   (host_us, us; 'opened' is after a 0.3 s sleep for plain)")
    for i in range(n):
        kind = "rig" if i % 2 == 0 else "plain"
        out = subprocess.run([sys.executable, __file__, "--one", kind], capture_output=True,
                             text=True, check=True).stdout.split()
        b, o, a, s, e = out
        print(f"{kind:<10} {b:>7} {o:>7} {a:>7} {s if kind == 'rig' else '':>8} {e:>8}",
              flush=True)


if __name__ == "__main__":
    main()
