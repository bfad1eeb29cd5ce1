"""Golden record of everything a fixed sequence of launches, copies and steps shows the GPU, on
the stand-in path (fake_gpu.py): optimisations of the submission path must not change a byte.

At every fence (the drain before a doorbell) the record takes each channel's GP_PUT and a hash
of its GPFIFO ring; at every doorbell write, its word and value, each channel's GP_PUT, the
new GPFIFO entries (address, length, and the words they name) and a hash of the stand-in's
memory (launch arena, pushbuffers, rings, USERD, step memory, the regions: all host memory
here). It also records the timeline value of every point returned. Two scenarios: the device's
own sizes, and rings made small (pushbuffers, launch arena, GPFIFO) so that all of them wrap.

The expectations (launch_golden.json) were computed from the code as it was when this test was
written. Regenerate them ONLY for an intended GPU-visible change:

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 \
        packages/rig-nv/tests/test_launch_golden.py --regenerate
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_gpu import FakePath, entry_words

from rig_edge import Memory
from rig_nv import channel as channel_module
from rig_nv import setup
from rig_nv.hostmem import view

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "launch_golden.json"
CUBIN = HERE / "cubins" / "kernels.sm_90.cubin"
PER_BELL_LIMIT = 8 << 20  # larger mappings (copy staging) are hashed at checkpoints only


class _Bell:
    """The usermode page: writes go to memory and into the record."""

    def __init__(self, record: _Record, memory: memoryview) -> None:
        self._record = record
        self._memory = memory.cast("B").cast("I")
        self.nbytes = memory.nbytes

    def cast(self, *_: Any) -> _Bell:
        return self

    def __getitem__(self, i: int) -> int:
        return int(self._memory[i])

    def __setitem__(self, i: int, value: int) -> None:
        self._memory[i] = value
        self._record.bell(i, value)


class _RecordingPath(FakePath):
    def __init__(self, record: _Record) -> None:
        super().__init__()
        self.record = record
        self.bell_at = 0

    def map_object(self, handle: int, length: int) -> Any:
        memory = super().map_object(handle, length)
        self.bell_at = self.mapped[-1][0]
        return _Bell(self.record, memory)


class _Record:
    def __init__(self, detailed: bool) -> None:
        self.detailed = detailed
        self.events: list[Any] = []
        self.path: _RecordingPath | None = None
        self.seen: dict[str, int] = {}
        self.digest = hashlib.sha256()

    def add(self, event: Any) -> None:
        self.digest.update(json.dumps(event).encode())
        if self.detailed:
            self.events.append(event)

    def _channels(self) -> list[Any]:
        d = self.path.device if self.path is not None else None
        return list(getattr(d, "_channels", []))

    def _memory(self, everything: bool) -> str:
        assert self.path is not None
        h = hashlib.sha256()
        for at, n in self.path.mapped:
            if at == self.path.bell_at or (n > PER_BELL_LIMIT and not everything):
                continue
            h.update(struct.pack("<QQ", at, n))
            h.update(view(at, n))
        return h.hexdigest()[:24]

    def fence(self) -> None:
        self.add(["fence", [[ch.name, int(ch.gpput[0]),
                             hashlib.sha256(ch.entries).hexdigest()[:16]]
                            for ch in self._channels()]])

    def bell(self, index: int, value: int) -> None:
        state = []
        for ch in self._channels():
            put = int(ch.gpput[0])
            last = self.seen.get(ch.name, 0)
            new = []
            count = len(ch.entries)
            i = last
            while i != put:
                entry = int(ch.entries[i])
                words = entry_words(entry)
                packed = struct.pack(f"<{len(words)}I", *words)
                new.append([entry, words] if self.detailed else
                           [entry, hashlib.sha256(packed).hexdigest()[:16]])
                i = (i + 1) % count
            self.seen[ch.name] = put
            state.append([ch.name, put, new])
        self.add(["bell", index, value, state, self._memory(False)])

    def checkpoint(self, what: str, result: Any = None) -> None:
        value = getattr(result, "value", None)
        self.add(["at", what, value, self._memory(True)])


@contextmanager
def _recording(detailed: bool, small: bool, monkeypatch: Any) -> Iterator[tuple[Any, Any, _Record]]:
    from rig_nv import device as device_module

    record = _Record(detailed)
    fence = channel_module.fence

    def recorded_fence() -> None:
        record.fence()
        fence()

    monkeypatch.setattr(channel_module, "fence", recorded_fence)
    if small:
        monkeypatch.setattr(setup, "PUSHBUFFER", 0x4000)
        monkeypatch.setattr(setup, "LAUNCH_ARENA", 0x8000)
        monkeypatch.setattr(setup, "GPFIFO_ENTRIES", 64)
        monkeypatch.setattr(setup, "CHANNEL_AREA", 0x1000)
    path = _RecordingPath(record)
    record.path = path
    d = device_module.Device(path)  # type: ignore[arg-type]
    path.device = d
    try:
        d._build()
        yield d, path, record
    finally:
        d.stop()


def _detailed(d: Any, path: Any, rec: _Record) -> None:
    """Launches of two kernels with changing arguments and grids, copies between them, a step
    submitted three times, launches after a second load, one under a profile."""
    at = rec.checkpoint
    img = d.load(CUBIN.read_bytes())
    at("load")
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    b = d.alloc(1 << 16, Memory.PINNED)
    at("upload", d.upload(b, bytes(range(256)) * 256))
    vadd, saxpy = img["vadd"], img["saxpy"]
    for n in (1024, 1024, 7, -3):
        at("vadd", d.launch(vadd, (4,), (256,), (a, a, b, n)))
    at("vadd grid", d.launch(vadd, (3, 2, 1), (64, 2, 1), (a, b, a, 99)))
    at("vadd grid", d.launch(vadd, (3, 2, 1), (64, 2, 1), (b, b, a, 98)))
    at("vadd list", d.launch(vadd, [5], [32], (a, a, a, 5)))
    at("vadd list", d.launch(vadd, [5], [32], (a, a, a, 6)))
    for x in (2.5, -1.0, 1e30):
        at("saxpy", d.launch(saxpy, (8,), (128,), (x, a, b, 77)))
    at("saxpy shared", d.launch(saxpy, (8,), (128,), (0.5, a, b, 77), shared=1024))
    at("saxpy shared", d.launch(saxpy, (8,), (128,), (0.25, b, a, 76), shared=1024))
    path.complete()
    at("copy", d.copy(b, a, 4096))
    at("vadd after copy", d.launch(vadd, (4,), (256,), (a, a, b, 11)))
    at("vadd", d.launch(vadd, (4,), (256,), (a, a, b, 12)))
    at("copy", d.copy(a, b, 512, dst_offset=256))
    at("saxpy after copy", d.launch(saxpy, (8,), (128,), (3.0, a, b, 77)))
    step = d.step()
    step.launch(vadd, (2,), (64,), (a, b, a, 128))
    step.launch(saxpy, (2,), (64,), (1.5, a, b, 128))
    step.copy(b, a, 1024)
    step.launch(vadd, (1,), (32,), (b, b, b, 32))
    at("step", step.submit())
    at("vadd", d.launch(vadd, (4,), (256,), (a, a, b, 13)))
    at("step", step.submit())
    at("copy", d.copy(b, a, 2048))
    at("step after copy", step.submit())
    at("vadd", d.launch(vadd, (4,), (256,), (a, a, b, 14)))
    path.complete()
    img2 = d.load(CUBIN.read_bytes())
    at("load again")
    at("vadd after load", d.launch(img2["vadd"], (4,), (256,), (a, a, b, 15)))
    at("old vadd", d.launch(vadd, (4,), (256,), (a, a, b, 16)))
    at("saxpy", d.launch(saxpy, (8,), (128,), (2.0, a, b, 77)))
    with d.profile(capacity=8):
        at("profiled vadd", d.launch(vadd, (4,), (256,), (a, a, b, 17)))
        at("profiled step", step.submit())
    at("vadd", d.launch(vadd, (4,), (256,), (a, a, b, 18)))
    at("local", d.launch(img["local_array"], (2,), (32,), (a, a, b, 64)))
    at("local", d.launch(img["local_array"], (2,), (32,), (a, a, b, 65)))
    at("vadd after local", d.launch(vadd, (4,), (256,), (a, a, b, 19)))
    path.complete()
    at("end")


def _wrapping(d: Any, path: Any, rec: _Record) -> None:
    """Enough launches, copies and steps for small rings to wrap many times."""
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    b = d.alloc(1 << 16, Memory.PINNED)
    vadd, saxpy = img["vadd"], img["saxpy"]
    step = d.step()
    step.launch(vadd, (2,), (64,), (a, b, a, 128))
    step.launch(saxpy, (2,), (64,), (1.5, a, b, 128))
    values = []
    for i in range(1500):
        if i % 3 == 0:
            p = d.launch(saxpy, (i % 7 + 1,), (128,), (float(i), a, b, i))
        else:
            p = d.launch(vadd, (4,), (256,), (a, a, b, i))
        values.append(p.value)
        if i % 97 == 0:
            values.append(d.copy(b, a, 64 + i).value)
        if i % 151 == 0:
            values.append(step.submit().value)
        if i % 10 == 9:
            path.complete()
    rec.add(["values", values])
    rec.checkpoint("end")


def _run(name: str, monkeypatch: Any) -> dict[str, Any]:
    detailed = name == "detailed"
    with _recording(detailed, not detailed, monkeypatch) as (d, path, rec):
        (_detailed if detailed else _wrapping)(d, path, rec)
        out: dict[str, Any] = {"sha256": rec.digest.hexdigest()}
        if detailed:
            out["events"] = rec.events
        return out


def _expected() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())  # type: ignore[no-any-return]


def _first_difference(got: list[Any], want: list[Any]) -> str:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"event {i}: got {json.dumps(g)[:2000]}\n  expected {json.dumps(w)[:2000]}"
    return f"{len(got)} events, expected {len(want)}"


def test_detailed_sequence_shows_the_gpu_the_recorded_bytes(monkeypatch: Any) -> None:
    got, want = _run("detailed", monkeypatch), _expected()["detailed"]
    if got["sha256"] != want["sha256"]:
        raise AssertionError(_first_difference(got["events"], want["events"]))


def test_wrapping_rings_show_the_gpu_the_recorded_bytes(monkeypatch: Any) -> None:
    assert _run("wrapping", monkeypatch)["sha256"] == _expected()["wrapping"]["sha256"]


def regenerate() -> None:
    import pytest

    result = {}
    for name in ("detailed", "wrapping"):
        mp = pytest.MonkeyPatch()
        try:
            result[name] = _run(name, mp)
        finally:
            mp.undo()
    GOLDEN.write_text(json.dumps(result, separators=(",", ":")) + "\n")


if __name__ == "__main__" and "--regenerate" in sys.argv:
    regenerate()


def test_a_region_address_no_pointer_holds_leaves_the_launch_as_it_was(
        dev: tuple[Any, Any]) -> None:
    """Arguments go straight into a slot (or the arena): one that fails there (a made-up
    Region whose address is no 64-bit number) takes no slot, no arena space and no timeline
    value, and sends nothing."""
    import pytest

    from rig_edge import Region

    d, _ = dev
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 16, Memory.DEVICE)
    d.launch(img["vadd"], (4,), (256,), (a, a, a, 1))  # the first: prepares, through the arena
    d.launch(img["vadd"], (4,), (256,), (a, a, a, 1))  # the second: makes the slots, uses one
    slots = img["vadd"].prepared[((4,), (256,), 0, d._slm)].slots
    head, turn, value, put = d._arena.head, slots.turn, d._next, d.compute.put
    bad = Region(-64, None, 64, Memory.DEVICE)
    with pytest.raises(struct.error):
        d.launch(img["vadd"], (4,), (256,), (a, a, bad, 1))
    assert (d._arena.head, slots.turn, d._next, d.compute.put) == (head, turn, value, put)
    d.launch(img["vadd"], (4,), (256,), (a, a, a, 2))
    assert slots.turn == turn + 1 and d._arena.head == head


def test_the_fast_paths_points_are_points(dev: tuple[Any, Any]) -> None:
    """Launches and steps after compute work make their points without Point's __init__:
    they must be the same as the ones it makes."""
    from rig_nv.device import Point

    d, _ = dev
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 16, Memory.DEVICE)
    step = d.step()
    step.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    for p in (d.launch(img["vadd"], (4,), (256,), (a, a, a, 1)),
              d.launch(img["vadd"], (4,), (256,), (a, a, a, 2)), step.submit(), step.submit()):
        made = Point(d, p.value)
        assert type(p) is Point and p == made and hash(p) == hash(made)
        assert vars(p) == vars(made) and repr(p) == repr(made)
    p.wait()
