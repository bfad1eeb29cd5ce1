"""Profiles: GPU timestamps around each submission while a device profiles, and Chrome traces.

While a :class:`Profile` is active, every submission of its device (a launch, a copy, an upload
or download chunk, a step) is bracketed by two host semaphore releases with RELEASE_TIMESTAMP
(clc86f.h SEM_EXECUTE): each waits for the engine to be idle, then writes the GPU's nanosecond
clock (PTIMER) into a slot of pinned memory, 16 bytes a release (payload at +0, time at +8).
The first stamp falls when the work before it is done, the second when this work is; the
times are the GPU's own clock, which drifts from the host's. A launch whose QMD releases its
value (a queue's, :mod:`rig_nv.setup`) is stamped without a wait for idle, which would hold
every queue of the group: its start when its channel reaches it (after its order's acquire),
its end by the QMD's second release (clcbc0qmd.h), once the grid is done.

Where the device reads that clock (``Device.clock``, :mod:`rig_nv.clock`: through BAR 0's
registers on the PCI path, through the RM on the kernel path), the profile takes a pair of the
host's clock (``time.monotonic_ns()``) and the GPU's as it starts and another as it ends, so
that its events are placed on the host's clock too (:attr:`Event.host_start_ns`,
:meth:`Profile.to_host`) and the drift between the two pairs is measured
(:attr:`Profile.drift_ppm`); its Chrome trace names the clock and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Misuse, RigError
from rig_nv.clock import Timebase, pair

if TYPE_CHECKING:
    from rig_nv.clock import Pair
    from rig_nv.device import Device
    from rig_nv.timeline import Timeline

SLOT = 16  # bytes a timestamp release writes (RELEASE_TIMESTAMP needs 16-byte alignment)


@dataclass(frozen=True)
class Event:
    """One submission's span on the GPU: ``name`` (the kernel, "copy", "upload", "step"),
    the queue it ran on, the timeline value, and its start and end in GPU nanoseconds; with
    ``host_start_ns`` and ``host_end_ns`` the same on the host's clock (``time.monotonic_ns()``,
    :meth:`Profile.to_host`), ``None`` where the device reads no GPU clock."""

    name: str
    queue: str
    value: int
    start_ns: int
    end_ns: int
    host_start_ns: int | None = None
    host_end_ns: int | None = None

    @property
    def duration_ns(self) -> int:
        """How long the event ran on the GPU's clock, in nanoseconds."""
        return self.end_ns - self.start_ns


class Profile:
    """Timestamps of a device's submissions while active (``with device.profile() as p``).

    Its times are the GPU's clock, which drifts from the host's. Where the device reads that
    clock (``device.clock`` not ``None``), entering takes a pair of the host's and the GPU's
    clocks (:class:`rig_nv.clock.Pair`), and leaving another: :attr:`timebase` places GPU
    times on the host's clock through them and :attr:`drift_ppm` measures the drift between
    them (a profile entered again keeps its first pair and takes a new last one). A pair
    that cannot be read as the profile ends is left out, and the mapping assumes no drift."""

    def __init__(self, device: Device, capacity: int = 4096,
                 timeline: Timeline | None = None) -> None:
        if not isinstance(capacity, int) or capacity <= 0:
            raise Misuse(f"a profile holds a positive number of events, not {capacity!r}")
        self.device = device
        self.timeline = timeline if timeline is not None else device.timeline  # the queue's
        self.capacity = capacity
        region = device.alloc(2 * SLOT * capacity, Memory.PINNED)
        if region is None or region.host is None:
            raise RigError(f"{device.facts.name}: no pinned memory for a profile")
        self.memory = region
        self._records: list[tuple[str, str, int]] = []  # (name, queue, value)
        self._start: Pair | None = None
        self._end: Pair | None = None

    def __enter__(self) -> Profile:
        """Start stamping the device's submissions, after taking the first pair of clocks
        (raises :class:`rig_edge.RigError` where the device's clock cannot be read)."""
        if self._start is None and self.device.clock is not None:
            self._start = pair(self.device.gpu_time_ns)
        self.timeline.set_profile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.timeline.set_profile(None)
        if self._start is not None:
            with contextlib.suppress(RigError):  # a lost device: the profile keeps one pair
                self._end = pair(self.device.gpu_time_ns)

    @property
    def timebase(self) -> Timebase | None:
        """The profile's pairs of clocks (:class:`rig_nv.clock.Timebase`), ``None`` where the
        device reads no GPU clock."""
        return None if self._start is None else Timebase(self._start, self._end)

    @property
    def drift_ppm(self) -> float | None:
        """How much faster the GPU's clock ran than the host's between the profile's start and
        end, in parts per million (within ``timebase.uncertainty_ppm``); ``None`` until it has
        ended, or where the device reads no GPU clock."""
        timebase = self.timebase
        return None if timebase is None else timebase.drift_ppm

    def to_host(self, gpu_ns: int) -> int | None:
        """GPU time ``gpu_ns`` (an event's) on the host's clock, ``time.monotonic_ns()``
        (:meth:`rig_nv.clock.Timebase.to_host`); ``None`` where the device reads no GPU
        clock."""
        timebase = self.timebase
        return None if timebase is None else timebase.to_host(gpu_ns)

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
        timebase = self.timebase
        out = []
        for i, (name, queue, value) in enumerate(self._records):
            start = struct.unpack_from("<Q", raw, 2 * SLOT * i + 8)[0]
            end = struct.unpack_from("<Q", raw, 2 * SLOT * i + SLOT + 8)[0]
            if timebase is None:
                out.append(Event(name, queue, value, start, end))
            else:
                out.append(Event(name, queue, value, start, end, timebase.to_host(start),
                                 timebase.to_host(end)))
        return out

    def clock_data(self) -> dict[str, Any]:
        """What the Chrome trace's ``otherData`` says of the clock: which it is, that its
        times drift from the host's, the pairs (host ns, GPU ns, spread ns) and the drift
        measured between them (ppm, and by how much it may be off)."""
        clock = self.device.clock
        if clock is None or self._start is None:
            return {"clock": "GPU PTIMER (ns), which this device does not read: its times "
                             "drift from the host's clock, by how much is not measured"}
        timebase = Timebase(self._start, self._end)
        data: dict[str, Any] = {
            "clock": clock.text,
            "drift": "the GPU's times drift from the host's clock (time.monotonic_ns); "
                     "host times map them through the pairs taken as the profile started "
                     "and ended",
            "pairs": [[p.host_ns, p.gpu_ns, p.spread_ns] for p in (self._start, self._end)
                      if p is not None],
        }
        if timebase.drift_ppm is not None:
            data["drift_ppm"] = timebase.drift_ppm
            data["drift_uncertainty_ppm"] = timebase.uncertainty_ppm
            data["drift_used"] = timebase.drift_used
        return data

    def chrome_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The events as a Chrome trace (chrome://tracing, Perfetto): one track per queue,
        microseconds of the GPU's clock from the first event; its ``otherData`` names the GPU,
        the clock and its drift from the host's (:meth:`clock_data`) and, where the device
        reads the clock, the first event's start on the host's clock (``origin_host_ns``).
        Written to ``path`` when given."""
        events = self.events()
        origin = min((e.start_ns for e in events), default=0)
        other = {"gpu": self.device.facts.bus, **self.clock_data()}
        host_origin = self.to_host(origin) if events else None
        if host_origin is not None:
            other["origin_host_ns"] = host_origin
        trace = {
            "traceEvents": [
                {"name": e.name, "cat": e.queue, "ph": "X", "pid": self.device.facts.name,
                 "tid": e.queue, "ts": (e.start_ns - origin) / 1000,
                 "dur": e.duration_ns / 1000, "args": {"value": e.value}}
                for e in events
            ],
            "displayTimeUnit": "ns",
            "otherData": other,
        }
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def free(self) -> None:
        """Give back the memory the profile's timestamps are written into."""
        self.device.free(self.memory)
