"""Build under_cuda.c as bench/run.py builds its CUDA bench (nvcc, else cc with a cuda.h it
finds, -lcuda or the driver's libcuda.so.1) and run it on rig's shipped copy cubin and the
variants (an experiment, not a test).

    python3 scripts/copy_variants/under_cuda.py
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


def build(name: str) -> Path | None:
    """Build ``name``.c of this folder (as bench/run.py builds cuda_bench.c); its program's
    path, or None (said on stderr) where no compiler and libcuda made it."""
    exe = Path(tempfile.mkdtemp()) / name
    src = HERE / f"{name}.c"
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
            return exe
    print(f"could not build {name}.c", file=sys.stderr)
    return None


def main() -> int:
    exe = build("under_cuda")
    if exe is None:
        return 1
    cubin = ROOT / "packages/rig-nv/src/rig_nv/kernels/copy.sm_90.cubin"
    return subprocess.run([str(exe), str(cubin), str(HERE / "variants.sm_90.cubin")]).returncode


if __name__ == "__main__":
    sys.exit(main())
