#!/usr/bin/env bash
# Builds each example kernel (examples/*.cu) for every architecture rig knows, into
# examples/cubins/NAME.sm_XX.cubin. The cubins are committed: the examples run without a
# CUDA toolkit. nvcc 13.0 built the committed ones.
#
#   examples/build.sh                          # nvcc from PATH
#   NVCC=/usr/local/cuda/bin/nvcc examples/build.sh
set -euo pipefail
cd "$(dirname "$0")"
nvcc=${NVCC:-nvcc}
echo "# $("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
for cu in *.cu; do
    for sm in 80 86 89 90 100 120; do
        out=cubins/${cu%.cu}.sm_$sm.cubin
        "$nvcc" -cubin -O3 -arch=sm_$sm -o "$out" "$cu"
        echo "$out ($(wc -c < "$out") bytes)"
    done
done
