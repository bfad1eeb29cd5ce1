#!/usr/bin/env bash
# Builds tma.sm_90a.cubin from tma.cu (test_gpu_tensormap.py launches it on the H200).
#   packages/rig-nv-nvidia/tests/cubins/build_tma.sh   # nvcc from PATH, or NVCC=/path/to/nvcc
set -euo pipefail
cd "$(dirname "$0")"
"${NVCC:-nvcc}" --version | grep -o 'release [0-9.]*, V[0-9.]*'
"${NVCC:-nvcc}" -cubin -arch=sm_90a -o tma.sm_90a.cubin tma.cu
ls -l tma.sm_90a.cubin
