# ruff: noqa: N803 (Triton spells block sizes in capitals)
"""Compiles examples/triton_softmax.py's kernel with Triton for every architecture rig knows,
into examples/cubins/triton_softmax.sm_XX.cubin and .json (Triton's metadata of the compiled
kernel, as its own launcher reads it, and the signature). Needs `pip install triton` and no
GPU (Triton's own ptxas does the last step); Triton 3.6.0 built the committed ones.

    python examples/triton/build.py
"""

from __future__ import annotations

import json
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

CUBINS = Path(__file__).resolve().parents[1] / "cubins"
SIGNATURE = {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_stride": "i32", "out_stride": "i32",
             "n_cols": "i32", "scale": "fp32", "BLOCK": "constexpr"}


@triton.jit
def softmax(out_ptr, in_ptr, in_stride, out_stride, n_cols, scale, BLOCK: tl.constexpr):
    # One program a row: the row's softmax of scale * x, over its n_cols <= BLOCK columns.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x * scale
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_stride + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


def plain(v: object) -> object:
    """Metadata as JSON: named tuples as dicts, tuples as lists."""
    if hasattr(v, "_asdict"):
        return {k: plain(x) for k, x in v._asdict().items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return v if isinstance(v, int | float | str | bool | type(None)) else repr(v)


def main() -> None:
    for sm in (80, 86, 89, 90, 100, 120):
        src = ASTSource(fn=softmax, signature=SIGNATURE, constexprs={(6,): 1024})
        kernel = triton.compile(src, target=GPUTarget("cuda", sm, 32), options={"num_warps": 8})
        out = CUBINS / f"triton_softmax.sm_{sm}"
        out.with_name(out.name + ".cubin").write_bytes(kernel.asm["cubin"])
        meta = {k: plain(v) for k, v in kernel.metadata._asdict().items() if k != "extern_libs"}
        out.with_name(out.name + ".json").write_text(json.dumps(
            {"triton": triton.__version__, "signature": SIGNATURE, "metadata": meta},
            indent=1) + "\n")
        print(out.name, len(kernel.asm["cubin"]), "bytes")


if __name__ == "__main__":
    main()
