"""Build under_cuda2.c as bench/run.py builds its CUDA bench (nvcc, else cc with a cuda.h it
finds, -lcuda or the driver's libcuda.so.1) and run it on rig's shipped copy cubin and the
variants (an experiment, not a test).

    python3 scripts/copy_variants/under_cuda2.py [CUBIN NAME:THREADS:UNITS...]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import run as bench  # noqa: E402


def main() -> int:
    exe = Path(tempfile.mkdtemp()) / "under_cuda2"
    src = HERE / "under_cuda2.c"
    links = bench.libcuda_args()
    tries = []
    nvcc = bench.find_nvcc()
    if nvcc:
        tries += [[nvcc, "-O2", "-o", str(exe), str(src), *link] for link in links]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        tries += [[cc, "-O2", "-o", str(exe), str(src), f"-I{inc}", *link]
                  for inc in bench.cuda_include_dirs() for link in links]
    for cmd in tries:
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            break
    else:
        print("could not build under_cuda2.c", file=sys.stderr)
        return 1
    kernels = ["flat4:256:4", "flat4_pf256:256:4", "flat4_noalloc:256:4", "flat4_ldef:256:4",
               "flat4_pfef:256:4", "flat4_stef:256:4", "flat4_bothef:256:4", "flat4_stna:256:4",
               "flat4_cs:256:4", "flat8_pf256:256:8", "flat2_512:512:2", "flat4_512:512:4",
               "flat2_1024:1024:2", "flat1_1024:1024:1", "flat8_128:128:8"]
    cubin = HERE / "variants5.sm_90.cubin"
    if len(sys.argv) > 2:  # a cubin and its kernels instead (rig's: copy.sm_90.cubin copy16:1024:2)
        cubin, kernels = Path(sys.argv[1]), sys.argv[2:]
    return subprocess.run([str(exe), str(cubin), *kernels]).returncode


if __name__ == "__main__":
    sys.exit(main())
