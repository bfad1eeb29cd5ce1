"""Small formatting helpers shared by the commands (no imports beyond the standard library)."""

from __future__ import annotations

# A value that is not there, in every text the commands print (nvidia-smi's word; JSON: null).
MISSING = "[N/A]"


def text(value: object) -> str:
    """``value`` as a table or CSV cell: :data:`MISSING` for ``None``."""
    return MISSING if value is None else str(value)


def size(n: int | None) -> str:
    """``n`` bytes in binary units: ``"256 GiB"``, ``"139.8 GiB"``, ``"32 MiB"``."""
    if n is None:
        return MISSING
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """``seconds`` in the unit that reads best: ``"8.4 µs"``, ``"312.0 ms"``, ``"1.25 s"``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def rate(n: int, seconds: float) -> str:
    """``n`` bytes in ``seconds`` as decimal gigabytes per second (as CUDA's tools print)."""
    return f"{n / seconds / 1e9:.2f} GB/s" if seconds > 0 else "unmeasurable"
