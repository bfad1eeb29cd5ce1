#!/usr/bin/env bash
# Builds the cubin fixtures that tests/test_cubin.py parses, and records beside each what
# ptxas -v reported while building it (the figures the tests check the parser against).
#
#   packages/rig-nv/tests/cubins/build.sh            # uses nvcc from PATH
#   NVCC=/usr/local/cuda/bin/nvcc .../build.sh
#
# Writes kernels.sm_XX.cubin and kernels.sm_XX.ptxas.txt (hopper.* likewise) for each
# architecture below. The first line of each report names the compiler; the rest is ptxas's
# stderr, unchanged.
set -euo pipefail
cd "$(dirname "$0")"
nvcc=${NVCC:-nvcc}
version=$("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')
# build NAME SM: NAME.cu for sm_SM, into NAME.sm_SM.cubin and NAME.sm_SM.ptxas.txt.
build() {
    local out=$1.sm_$2.cubin report=$1.sm_$2.ptxas.txt
    "$nvcc" -cubin -arch=sm_$2 -Xptxas -v -o "$out" "$1.cu" 2> "$report.tmp"
    { echo "# nvcc $version: $nvcc -cubin -arch=sm_$2 -Xptxas -v $1.cu"; cat "$report.tmp"; } > "$report"
    rm -f "$report.tmp"
    echo "$out ($(wc -c < "$out") bytes), $report"
}
for sm in 80 86 89 90 100 120; do build kernels $sm; done
# Hopper's launch features (clusters, cooperative grids): hopper.cu for sm_90 on.
for sm in 90 100; do build hopper $sm; done
