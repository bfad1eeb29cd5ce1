"""The bench's plots (matplotlib, where installed): rig's and the peers' ratios to CUDA from C
with each ratio's spread over rounds (bench.png), copy bandwidth by size (bench-sweep.png), and
the distribution of launch+wait times of the last round (bench-latency.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rows import ROWS, SWEEP


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def saved(plt: Any, fig: Any, path: Path, drawn: bool, missing: str) -> str:
    """Write ``fig`` to ``path`` where it shows anything; the path, or why there is no plot."""
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path) if drawn else f"no plot: {missing}"


def plot(table: dict[str, Any], path: Path) -> str:
    """Each row's ratio to CUDA from C per peer, rig's with its min-max over rounds."""
    try:
        plt = pyplot()
    except ImportError as e:
        return f"no plot: {e}"
    rows = [r for r in ROWS if r.key in table
            and any(v is not None for v in table[r.key]["ratios"].values())]
    if not rows:
        return "no plot: no ratios"
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    colours = {"rig": "tab:blue", "torch": "tab:orange", "cupy": "tab:green"}
    height = 0.27
    for i, peer in enumerate(("rig", "torch", "cupy")):
        ys, xs, spread = [], [], []
        for j, r in enumerate(rows):
            v = table[r.key]["ratios"].get(peer)
            if v is not None and v > 0:
                ys.append(j + (i - 1) * height)
                xs.append(v)
                e = table[r.key]
                if peer == "rig" and r.ref == "cuda" and e.get("ratio_min") is not None:
                    spread.append((v - e["ratio_min"], e["ratio_max"] - v))
                else:
                    spread.append((0.0, 0.0))
        if xs:
            ax.barh(ys, xs, height=height, color=colours[peer], label=f"{peer} / CUDA-C",
                    xerr=list(zip(*spread, strict=True)), capsize=2)
    for j, r in enumerate(rows):
        if r.target and r.target[0] in ("<=", ">=") and r.ref == "cuda":
            ax.plot([r.target[1]] * 2, [j - 0.45, j + 0.45], color="black", lw=2)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    higher = ("GB/s", "TFLOP/s", "launches/s")
    ax.set_yticklabels([f"{r.label} ({'higher' if r.unit in higher else 'lower'} is better)"
                        for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to CUDA from C (black: target; bars: rig's min-max over rounds)")
    ax.legend(loc="lower right", fontsize=8)
    return saved(plt, fig, path, True, "")


def plot_sweep(table: dict[str, Any], path: Path) -> str:
    """Row 10: GB/s by copy size, rig and CUDA, one panel per kind."""
    try:
        plt = pyplot()
    except ImportError as e:
        return f"no plot: {e}"
    kinds = ("h2d", "d2h", "d2d")
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    drawn = False
    for ax, kind in zip(axes, kinds, strict=True):
        lines = [("rig", kind), ("cuda", kind)] + ([("rig", "d2d_ce"), ("rig", "d2d_sm")]
                                                   if kind == "d2d" else [])
        for peer, k in lines:
            xs, ys = [], []
            for name, n in SWEEP:
                v = table.get(f"10_{k}_{name}", {}).get("peers", {}).get(peer, {}).get("value")
                if v is not None:
                    xs.append(n)
                    ys.append(v)
            if xs:
                drawn = True
                ax.plot(xs, ys, marker="o", label=f"{peer} {k.replace('_', ' ')}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.set_xlabel("bytes")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=8)
    return saved(plt, fig, path, drawn, "no row 10")


def plot_latency(rounds: list[dict[str, Any]], path: Path) -> str:
    """Row 1's samples of the last round that has them: launch+wait times, rig and CUDA."""
    try:
        plt = pyplot()
    except ImportError as e:
        return f"no plot: {e}"
    fig, ax = plt.subplots(figsize=(8, 4))
    drawn = False
    for peer in ("rig", "cuda"):
        got = next((r[peer]["rows"]["1_launch"]["samples_s"] for r in reversed(rounds)
                    if r.get(peer, {}).get("rows", {}).get("1_launch", {}).get("samples_s")),
                   None)
        if got:
            drawn = True
            ax.hist([x * 1e6 for x in got], bins=200, histtype="step", log=True, label=peer)
    ax.set_xlabel("launch+wait, us")
    ax.set_ylabel("samples")
    ax.legend()
    return saved(plt, fig, path, drawn, "no row 1")
