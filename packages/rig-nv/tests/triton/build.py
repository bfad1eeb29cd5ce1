# ruff: noqa: N803 (Triton spells block sizes and matrix sizes in capitals)
"""Compiles the Triton fixtures that tests/test_triton.py reads: real Triton 3.6 output for
sm_90a, built on a machine with no GPU (the ptxas Triton ships does the last step).

    python packages/rig-nv/tests/triton/build.py      # needs `pip install triton==3.6.0`

Writes <name>.cubin and <name>.json (the CompiledKernel's metadata, as Triton's own launcher
reads it, plus the signature and constexprs the kernel was compiled with) for each kernel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HERE = Path(__file__).resolve().parent
TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.jit
def softmax(out_ptr, in_ptr, in_stride, out_stride, n_cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x * scale
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
           stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a += BK * stride_ak
        b += BK * stride_bk
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c, acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def matmul_tma(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([k, pid_n * BN]))
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


@triton.jit
def tile_copy(in_desc, out_desc, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    out_desc.store([pid_m * BM, pid_n * BN], in_desc.load([pid_m * BM, pid_n * BN]))


MATMUL_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32",
              "K": "i32", "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32",
              "stride_bn": "i32", "stride_cm": "i32", "stride_cn": "i32",
              "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
MATMUL_CONST = {"BM": 128, "BN": 128, "BK": 64}

KERNELS: dict[str, tuple[object, dict[str, str], dict[str, object], dict[str, int]]] = {
    "vector_add": (vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
                                "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024},
                   {"num_warps": 4}),
    "softmax": (softmax, {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_stride": "i32",
                          "out_stride": "i32", "n_cols": "i32", "scale": "fp32",
                          "BLOCK": "constexpr"}, {"BLOCK": 1024}, {"num_warps": 8}),
    "matmul": (matmul, MATMUL_SIG, MATMUL_CONST, {"num_warps": 8, "num_stages": 3}),
    "matmul_ctas2": (matmul, MATMUL_SIG, MATMUL_CONST,
                     {"num_warps": 8, "num_stages": 3, "num_ctas": 2}),
    "matmul_tma": (matmul_tma, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16",
                                "M": "i32", "N": "i32", "K": "i32", "BM": "constexpr",
                                "BN": "constexpr", "BK": "constexpr"},
                   MATMUL_CONST, {"num_warps": 8, "num_stages": 3}),
    "tile_copy": (tile_copy, {"in_desc": "tensordesc<fp16[64, 64]>",
                              "out_desc": "tensordesc<fp16[64, 64]>", "BM": "constexpr",
                              "BN": "constexpr"}, {"BM": 64, "BN": 64}, {"num_warps": 4}),
}


MACHINE_SPECIFIC = {"extern_libs"}  # paths into the venv that built them


def _plain(v: object) -> object:
    """Metadata as JSON: named tuples as dicts, tuples as lists, the rest as Triton has it."""
    if hasattr(v, "_asdict"):
        return {k: _plain(x) for k, x in v._asdict().items()}  # type: ignore[attr-defined]
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v if isinstance(v, int | float | str | bool | type(None)) else repr(v)


def main() -> None:
    names = sys.argv[1:] or list(KERNELS)
    for name in names:
        fn, signature, constexprs, options = KERNELS[name]
        src = ASTSource(fn=fn, signature=signature,
                        constexprs={(fn.arg_names.index(k),): v  # type: ignore[attr-defined]
                                    for k, v in constexprs.items()})
        kernel = triton.compile(src, target=TARGET, options=options)
        (HERE / f"{name}.cubin").write_bytes(kernel.asm["cubin"])
        meta = {"triton": triton.__version__, "signature": signature,
                "constexprs": constexprs, "options": options,
                "metadata": {k: _plain(v) for k, v in kernel.metadata._asdict().items()
                             if k not in MACHINE_SPECIFIC}}
        (HERE / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(name, len(kernel.asm["cubin"]), "bytes", meta["metadata"]["shared"], "shared")


if __name__ == "__main__":
    main()
