"""A device's facts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Facts:
    """What a device is, answered even after it is lost.

    ``arch``: the compute architecture, e.g. ``"sm_90"``. ``budget``: bytes of GPU memory the
    process may use. ``queues``: the device's queue names. ``hang_ms``: after how many
    milliseconds without progress rig gives the device's work up (``None`` where the driver's
    watchdog does it). ``maps_host``: whether ``map_host`` can map the caller's memory.
    ``bus``: the GPU's PCI function (e.g. ``"0000:00:06.0"``). ``driver``: the driver
    release the path speaks, e.g. ``"580.159.04"``.
    """

    name: str
    arch: str
    budget: int
    queues: tuple[str, ...]
    hang_ms: int | None
    maps_host: bool
    bus: str
    driver: str
