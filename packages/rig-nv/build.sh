#!/usr/bin/env bash
# Builds rig_nv's built-in kernels (src/rig_nv/kernels/*.cu) for every architecture rig
# launches on; the cubins are committed and ship in the wheel. nvcc 13.0 made them:
#
#   packages/rig-nv/build.sh                          # nvcc from PATH
#   NVCC=/usr/local/cuda/bin/nvcc packages/rig-nv/build.sh
set -euo pipefail
cd "$(dirname "$0")/src/rig_nv/kernels"
nvcc=${NVCC:-nvcc}
echo "# $("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
for sm in 80 86 89 90 100 120; do
    "$nvcc" -cubin -O3 -arch=sm_$sm -o copy.sm_$sm.cubin copy.cu
done
ls -l *.cubin
