#!/usr/bin/env bash
# Builds the cubins of `rig check`'s built-in kernel (src/rig_cli/kernels/vadd.cu), one per
# architecture rig knows, into src/rig_cli/kernels/vadd.sm_XX.cubin. They are committed and
# ship in the wheel as package data, so installing rig-cli needs no CUDA toolkit.
#
#   packages/rig-cli/build.sh                         # nvcc from PATH (13.0 built the committed ones)
#   NVCC=/usr/local/cuda/bin/nvcc packages/rig-cli/build.sh
set -euo pipefail
cd "$(dirname "$0")/src/rig_cli/kernels"
nvcc=${NVCC:-nvcc}
echo "# $("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
for sm in 80 86 89 90 100 120; do
    out=vadd.sm_$sm.cubin
    "$nvcc" -cubin -arch=sm_$sm -o "$out" vadd.cu
    echo "$out ($(wc -c < "$out") bytes)"
done
