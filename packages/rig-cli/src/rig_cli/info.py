"""``rig info`` (a GPU's facts, read by opening it) and ``rig usage`` (its memory and how busy
it is, read without opening a device), both through NVIDIA's kernel driver. ``rig info
--machine`` shows another machine's GPU from its PCI listing, without opening it."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TextIO

from rig_cli.show import MISSING, duration, size
from rig_edge import Misuse, RigError

if TYPE_CHECKING:
    from rig_nv_nvidia import Usage
    from rig_pci import Machine


@dataclass(frozen=True)
class Info:
    """What ``rig info`` shows of a GPU (``--json`` prints these fields)."""

    index: int
    name: str
    bus: str
    device_id: str | None
    product: str | None
    arch: str
    sm_count: int
    budget_bytes: int
    bar1_bytes: int | None
    classes: dict[str, str]
    qmd_version: int
    queues: list[str]
    hang_ms: int | None
    maps_host: bool
    driver: str
    open_seconds: float


def facts(index: int) -> Info:
    """Open GPU ``index`` through the kernel driver, read what it is, stop it."""
    import rig_nv_nvidia
    from rig_cli.chips import chip
    from rig_cli.listing import bar1
    from rig_pci import Machine

    t = time.perf_counter()
    d = rig_nv_nvidia.gpu(index).open()
    opened = time.perf_counter() - t
    try:
        f = d.facts
        c = d.classes
        try:
            function = Machine.this().function(f.bus)
            device_id: int | None = function.device
            bar1_bytes = bar1(function)
        except RigError:
            device_id, bar1_bytes = None, None
        return Info(
            index=index,
            name=f.name,
            bus=f.bus,
            device_id=f"0x{device_id:04x}" if device_id is not None else None,
            product=chip(device_id).name if device_id is not None else None,
            arch=f.arch,
            sm_count=d.sm_count,
            budget_bytes=f.budget,
            bar1_bytes=bar1_bytes,
            classes={"usermode": f"0x{c.usermode:04x}", "gpfifo": f"0x{c.gpfifo:04x}",
                     "compute": f"0x{c.compute:04x}", "copy": f"0x{c.copy:04x}"},
            qmd_version=c.qmd_version,
            queues=list(f.queues),
            hang_ms=f.hang_ms,
            maps_host=f.maps_host,
            driver=f.driver,
            open_seconds=opened,
        )
    finally:
        d.stop()


def run_info(index: int, *, as_json: bool) -> int:
    i = facts(index)
    if as_json:
        print(json.dumps(asdict(i), indent=2))
        return 0
    c = i.classes
    print(f"GPU {index} ({i.name}): {i.product or MISSING} at {i.bus}, "
          f"PCI device {i.device_id or MISSING}")
    for key, value in (
        ("arch", f"{i.arch}, {i.sm_count} SMs"),
        ("memory budget", size(i.budget_bytes)),
        ("BAR1", size(i.bar1_bytes)),
        ("classes", f"usermode {c['usermode']}, GPFIFO {c['gpfifo']}, compute {c['compute']}, "
                    f"copy {c['copy']} (QMD v{i.qmd_version})"),
        ("queues", ", ".join(i.queues)),
        ("hang_ms", "none (the driver's watchdog gives hung work up)" if i.hang_ms is None
         else f"{i.hang_ms} (rig gives work up after {i.hang_ms} ms without progress)"),
        ("maps_host", "yes" if i.maps_host else "no"),
        ("driver", f"NVIDIA kernel driver {i.driver}"),
        ("opened in", duration(i.open_seconds)),
    ):
        print(f"  {key:<14}{value}")
    return 0


def run_pci_info(index: int, machine: Machine, *, as_json: bool) -> int:
    """GPU ``index`` of ``machine`` as its PCI listing shows it (``rig list``'s row): the GPU
    is not opened, as a device opens only in the process that holds it, on its machine."""
    from rig_cli.changes import NoSuchGpu
    from rig_cli.listing import rows

    if index < 0:
        raise Misuse(f"GPU index {index} is negative")
    found = rows(machine)
    if index >= len(found):
        raise NoSuchGpu(f"{machine.name} has no GPU {index} (it has {len(found)})")
    r = found[index]
    del r["memory_bytes"]
    if as_json:
        print(json.dumps({**r, "machine": machine.name}, indent=2))
        return 0
    bar1_bytes, paths = r["bar1_bytes"], r["paths"]
    print(f"GPU {index} of {machine.name}: {r['name']} ({r['chip']}) at {r['bus']}, PCI device "
          f"{r['device_id']} (from its PCI listing: not opened, as only a process on that "
          "machine opens its GPUs)")
    for key, value in (
        ("arch", r["arch"]),
        ("BAR1", size(bar1_bytes if isinstance(bar1_bytes, int) else None)),
        ("driver", r["driver"] or "none"),
        ("power", r["runtime_status"] or "unknown"),
        ("paths", " ".join(map(str, paths)) if isinstance(paths, list) and paths else "none"),
    ):
        print(f"  {key:<14}{value}")
    return 0


def _line(index: int, bus: str, u: Usage, window: float) -> str:
    used = u.memory_total - u.memory_free
    busy = "no samples" if u.busy is None else f"{u.busy:.1f} %"
    return (f"GPU {index} {bus}: memory {size(used)} used of {size(u.memory_total)} "
            f"({size(u.memory_free)} free), busy {busy} over {window:g} s")


def _record(index: int, bus: str, u: Usage, window: float) -> dict[str, object]:
    return {"index": index, "bus": bus, "memory_total": u.memory_total,
            "memory_free": u.memory_free, "busy": u.busy, "window": window,
            "time": time.time()}


def run_usage(index: int, *, window: float, watch: float | None, as_json: bool,
              out: TextIO | None = None) -> int:
    """Print GPU ``index``'s usage once, or every ``watch`` seconds until Ctrl-C (exit 0).

    On a terminal the line is redrawn in place (ANSI: carriage return, erase line); otherwise
    each sample is a line of its own, stamped with the time, for logs and pipes.
    """
    import rig_nv_nvidia

    stream = out or sys.stdout
    if watch is not None and not (math.isfinite(watch) and watch > 0):
        raise Misuse(f"--watch needs a positive number of seconds, not {watch!r}")
    u = rig_nv_nvidia.usage(index, window=window)
    bus = rig_nv_nvidia.buses()[index]
    if watch is None:
        print(json.dumps(_record(index, bus, u, window)) if as_json
              else _line(index, bus, u, window), file=stream)
        return 0
    live = stream.isatty() and not as_json
    try:
        while True:
            started = time.monotonic()
            if as_json:
                print(json.dumps(_record(index, bus, u, window)), file=stream, flush=True)
            elif live:
                stream.write(f"\r\x1b[2K{time.strftime('%H:%M:%S')} "
                             f"{_line(index, bus, u, window)}  (Ctrl-C to stop)")
                stream.flush()
            else:
                print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {_line(index, bus, u, window)}",
                      file=stream, flush=True)
            time.sleep(max(0.0, watch - (time.monotonic() - started)))
            u = rig_nv_nvidia.usage(index, window=window)
    except KeyboardInterrupt:
        if live:
            stream.write("\n")
            stream.flush()
        return 0
