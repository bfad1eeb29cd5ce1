"""Build under_cuda2.c as under_cuda.py builds under_cuda.c and run it on variants5.cu's
copy kernels beside cuMemcpyDtoD, or on a cubin and kernels named (an experiment, not a test).

    python3 scripts/copy_variants/under_cuda2.py [CUBIN NAME:THREADS:UNITS...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from under_cuda import HERE, build


def main() -> int:
    exe = build("under_cuda2")
    if exe is None:
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
