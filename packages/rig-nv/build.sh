#!/usr/bin/env bash
# Builds rig_nv's built-in kernels (src/rig_nv/kernels/*.cu) for every architecture rig
# launches on; the cubins are committed and ship in the wheel. Needs nvcc (13.0 made them).
set -euo pipefail
cd "$(dirname "$0")/src/rig_nv/kernels"
for sm in 80 86 89 90 100 120; do
    nvcc -cubin -O3 -arch=sm_$sm -o copy.sm_$sm.cubin copy.cu
done
ls -l *.cubin
