# ruff: noqa: N803 (Triton spells block sizes in capitals)
"""Row 12: Triton's fp16 matmul at 8192^3, compiled here by the installed Triton for this GPU,
launched by rig (rig_nv.triton) in the rig worker and by Triton's own launcher (CUDA's
cuLaunchKernelEx) in the torch worker, with torch.matmul beside it as the ceiling. Both
workers compile the same source with the same options, and record the cubin's digest, so the
JSON shows they ran the same cubin. Every product is checked on rows of fresh random data
against numpy before its samples count.
"""

from __future__ import annotations

import hashlib
from typing import Any

import triton
import triton.language as tl

SIZE = 8192
BM, BN, BK, GROUP = 128, 256, 64, 8
OPTIONS = {"num_warps": 8, "num_stages": 3}
FLOPS = 2 * SIZE**3
CHECK_ROWS = 4


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
           stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           GROUP: tl.constexpr):
    # Triton's tutorial matmul: programs grouped along M for L2 reuse; sizes divide the tiles.
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    in_group = GROUP * n_n
    first_m = (pid // in_group) * GROUP
    size_m = min(n_m - first_m, GROUP)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BK * stride_ak
        b += BK * stride_bk
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(tl.float16))


# What triton.jit specializes for these arguments, spelled out for ASTSource: unit strides
# are constexprs, and pointers and sizes divisible by 16 say so. Without them the loads are
# scalar and the kernel ran 27.7 TFLOP/s on the H200 (2026-12-01); with them, cp.async.
SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32",
             "K": "i32", "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32",
             "stride_bn": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr",
             "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "GROUP": "constexpr"}
CONSTEXPRS = {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, "BM": BM, "BN": BN, "BK": BK,
              "GROUP": GROUP}
DIVISIBLE_BY_16 = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk",
                   "stride_cm")


def compile_for(cc: tuple[int, int]) -> Any:
    """The kernel compiled for compute capability ``cc`` (sm_90a on Hopper)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    place = matmul.arg_names.index
    src = ASTSource(fn=matmul, signature=SIGNATURE,
                    constexprs={(place(k),): v for k, v in CONSTEXPRS.items()},
                    attrs={(place(k),): [["tt.divisibility", 16]] for k in DIVISIBLE_BY_16})
    return triton.compile(src, target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32),
                          options=OPTIONS)


def digest(kernel: Any) -> str:
    return hashlib.sha256(kernel.asm["cubin"]).hexdigest()[:16]


def grid() -> tuple[int, int, int]:
    return ((SIZE // BM) * (SIZE // BN), 1, 1)


def args(a: Any, b: Any, c: Any) -> tuple[Any, ...]:
    """The kernel's arguments, constexprs in their places (both launchers leave them out)."""
    n = SIZE
    return (a, b, c, n, n, n, n, 1, n, 1, n, 1, BM, BN, BK, GROUP)


def inputs(rng: Any) -> tuple[Any, Any]:
    import numpy as np

    a = (rng.standard_normal((SIZE, SIZE), dtype=np.float32) / 8).astype(np.float16)
    b = (rng.standard_normal((SIZE, SIZE), dtype=np.float32) / 8).astype(np.float16)
    return a, b


def check(a: Any, b: Any, rows: Any, got: Any, what: str) -> None:
    """``got`` (CHECK_ROWS x SIZE, fp16) against numpy's product of those rows of ``a``."""
    import numpy as np

    want = a[rows].astype(np.float32) @ b.astype(np.float32)
    err = np.abs(got.astype(np.float32) - want).max()
    if not np.isfinite(err) or err > 0.05 + 0.01 * np.abs(want).max():
        raise AssertionError(f"{what}: the product is off by up to {err} on rows {rows}")
