"""Profiles: GPU timestamps around each submission while a device profiles, and Chrome traces.

While a :class:`Profile` is active, every submission of its device (a launch, a copy, an upload
or download chunk, a step) is bracketed by two host semaphore releases with RELEASE_TIMESTAMP
(clc86f.h SEM_EXECUTE): each waits for the engine to be idle, then writes the GPU's nanosecond
clock (PTIMER) into a slot of pinned memory, 16 bytes a release (payload at +0, time at +8).
The first stamp falls when the work before it is done, the second when this work is; the
times are the GPU's own clock, which drifts from the host's.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Misuse, RigError

if TYPE_CHECKING:
    from rig_nv.device import Device

SLOT = 16  # bytes a timestamp release writes (RELEASE_TIMESTAMP needs 16-byte alignment)


@dataclass(frozen=True)
class Event:
    """One submission's span on the GPU: ``name`` (the kernel, "copy", "upload", "step"),
    the queue it ran on, the timeline value, and its start and end in GPU nanoseconds."""

    name: str
    queue: str
    value: int
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class Profile:
    """Timestamps of a device's submissions while active (``with device.profile() as p``)."""

    def __init__(self, device: Device, capacity: int = 4096) -> None:
        if not isinstance(capacity, int) or capacity <= 0:
            raise Misuse(f"a profile holds a positive number of events, not {capacity!r}")
        self.device = device
        self.capacity = capacity
        region = device.alloc(2 * SLOT * capacity, Memory.PINNED)
        if region is None or region.host is None:
            raise RigError(f"{device.facts.name}: no pinned memory for a profile")
        self.memory = region
        self._records: list[tuple[str, str, int]] = []  # (name, queue, value)

    def __enter__(self) -> Profile:
        self.device._profile = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.device._profile = None

    def take(self, name: str, queue: str) -> tuple[int, int]:
        """GPU addresses of the start and end stamps of the next submission."""
        i = len(self._records)
        if i >= self.capacity:
            raise RigError(f"the profile holds {self.capacity} events; start another one")
        self._records.append((name, queue, 0))
        base = self.memory.gpu + 2 * SLOT * i
        return base, base + SLOT

    def value(self, value: int) -> None:
        """The timeline value of the submission the last :meth:`take` stamped."""
        name, queue, _ = self._records[-1]
        self._records[-1] = (name, queue, value)

    def events(self) -> list[Event]:
        """Every stamped submission, once the device has done them."""
        self.device.synchronize()
        from rig_nv.hostmem import view

        assert self.memory.host is not None
        raw = bytes(view(self.memory.host, 2 * SLOT * len(self._records)))
        out = []
        for i, (name, queue, value) in enumerate(self._records):
            start = struct.unpack_from("<Q", raw, 2 * SLOT * i + 8)[0]
            end = struct.unpack_from("<Q", raw, 2 * SLOT * i + SLOT + 8)[0]
            out.append(Event(name, queue, value, start, end))
        return out

    def chrome_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The events as a Chrome trace (chrome://tracing, Perfetto): one track per queue,
        microseconds from the first event; written to ``path`` when given."""
        events = self.events()
        origin = min((e.start_ns for e in events), default=0)
        trace = {
            "traceEvents": [
                {"name": e.name, "cat": e.queue, "ph": "X", "pid": self.device.facts.name,
                 "tid": e.queue, "ts": (e.start_ns - origin) / 1000,
                 "dur": e.duration_ns / 1000, "args": {"value": e.value}}
                for e in events
            ],
            "displayTimeUnit": "ns",
            "otherData": {"gpu": self.device.facts.bus, "clock": "GPU PTIMER (ns)"},
        }
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def free(self) -> None:
        self.device.free(self.memory)
