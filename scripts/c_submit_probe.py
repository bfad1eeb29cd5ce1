"""Probe (issue 23, row 3): what a compiled submission would save on the CPU. Builds, in a
temporary folder, a C function that does what ``rig_nv.channel.Channel.submit_entry`` does
after its bookkeeping (the GPFIFO entry, GP_PUT, a fence, the doorbell), through cffi's API
mode (it needs a C compiler), and times it against the Python method on the stand-in path
(packages/rig-nv/tests/fake_gpu.py), interleaved, in the thread's CPU time. Nothing runs on
a GPU; rig itself ships no compiled code.

python3 scripts/c_submit_probe.py [rounds]"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/rig-nv/tests"))

from fake_gpu import open_fake  # noqa: E402

from rig_edge import Memory  # noqa: E402

CDEF = ("void submit_entry(uint64_t *ring, uint32_t *gpput, uint32_t *bell, uint32_t token, "
        "uint64_t put, uint64_t mask, uint64_t entry);")
SOURCE = r"""
#include <stdint.h>
void submit_entry(uint64_t *ring, uint32_t *gpput, uint32_t *bell, uint32_t token,
                  uint64_t put, uint64_t mask, uint64_t entry) {
    ring[put & mask] = entry;
    *(volatile uint32_t *)gpput = (uint32_t)((put + 1) & mask);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* a locked instruction, as rig's fence */
    *(volatile uint32_t *)bell = token;
}
"""
CALLS = 20_000


def build(folder: str) -> object:
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source("_c_submit", SOURCE)
    path = ffi.compile(tmpdir=folder)
    spec = importlib.util.spec_from_file_location("_c_submit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        c = build(folder)
        ffi, lib = c.ffi, c.lib  # type: ignore[attr-defined]
        d, path = open_fake()
        img = d.load((ROOT / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin").read_bytes())
        path.complete()
        a = d.alloc(1 << 16, Memory.DEVICE)
        step = d.step()
        step.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
        step.submit()
        d.timeline.word[0] = 1 << 62  # every value complete: no waits
        ch = d.compute
        ring = ffi.from_buffer("uint64_t[]", ch.entries.cast("B"), require_writable=True)
        gpput = ffi.from_buffer("uint32_t[]", ch.gpput.cast("B"), require_writable=True)
        bell = ffi.from_buffer("uint32_t[]", ch.doorbell.cast("B"), require_writable=True)
        entry, token, mask = step.entry, ch.token, ch.count - 1

        def in_c() -> None:
            lib.submit_entry(ring, gpput, bell, token, 5, mask, entry)

        ways: dict[str, Callable[[], object]] = {
            "Channel.submit_entry (Python)": lambda: ch.submit_entry(entry, 5, 1 << 61),
            "the same in C through cffi": in_c,
            "Step.submit, all of it (Python)": step.submit,
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(rounds):
            for name, f in ways.items():
                t = time.thread_time()
                for _ in range(CALLS):
                    f()
                times[name].append((time.thread_time() - t) / CALLS * 1e6)
        d.timeline.word[0] = d.timeline.current()
        d.stop()
    print(f"{rounds} rounds of {CALLS} calls each, interleaved; us of thread CPU a call")
    for name, got in times.items():
        print(f"{name:34} median {statistics.median(got):.3f}  least {min(got):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
