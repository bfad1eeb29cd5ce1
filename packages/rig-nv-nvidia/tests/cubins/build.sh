#!/usr/bin/env bash
# Builds faults.sm_90.cubin from faults.cu (test_gpu_faults.py launches it on the H200).
#   packages/rig-nv-nvidia/tests/cubins/build.sh   # nvcc from PATH, or NVCC=/path/to/nvcc
set -euo pipefail
cd "$(dirname "$0")"
"${NVCC:-nvcc}" -cubin -arch=sm_90 -o faults.sm_90.cubin faults.cu
ls -l faults.sm_90.cubin
