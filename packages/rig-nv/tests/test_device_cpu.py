"""rig_nv.Device on the CPU, over a stand-in RM path (fake_gpu.py): what make() asks of the RM,
and the words, QMDs and constant banks a launch, a copy and a step write. Nothing runs."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from fake_gpu import entry_words

from rig_edge import Memory
from rig_nv import push, qmd
from rig_nv.hostmem import view

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"


def commands(d: Any, channel: Any) -> list[list[int]]:
    """Each GPFIFO entry's words, decoded from the ring and the pushbuffer."""
    return [entry_words(int(channel.entries[i])) for i in range(channel.put)]


def methods(words: list[int]) -> list[tuple[int, int, list[int]]]:
    """(subchannel, method, data) of each incrementing method header."""
    out, i = [], 0
    while i < len(words):
        h = words[i]
        count, subc, method = (h >> 16) & 0x1FFF, (h >> 13) & 7, (h & 0xFFF) << 2
        out.append((subc, method, words[i + 1 : i + 1 + count]))
        i += 1 + count
    return out


V4_RELEASE = (40, 80)  # clcbc0qmd.h: RELEASE_ENABLE(0) MW(320); RELEASE_SEMAPHORE0 MW(640)
TWO_WORDS_64 = 1 | 2 << 1 | 1 << 12  # ENABLE, STRUCTURE_SIZE TWO_WORDS, PAYLOAD64B
V4_STAMP = (42, 96)  # RELEASE_ENABLE(1) MW(336); RELEASE_SEMAPHORE1 MW(768)
FOUR_WORDS_64 = 1 | 0 << 1 | 1 << 12  # ENABLE, STRUCTURE_SIZE FOUR_WORDS, PAYLOAD64B


def qmd_of(words: list[int]) -> memoryview:
    """The QMD a launch's SEND_PCAS_A names (the stand-in's GPU addresses are the host's)."""
    (address,) = [d[0] << 8 for _, m, d in methods(words) if m == push.COMPUTE_SEND_PCAS_A]
    return view(address, 384)


def release(q: memoryview) -> tuple[int, int, int]:
    """(control bits, address, payload) of a V4 QMD's first release."""
    (control,) = struct.unpack_from("<H", q, V4_RELEASE[0])
    return (control, *struct.unpack_from("<QQ", q, V4_RELEASE[1]))


def stamp(q: memoryview) -> tuple[int, int]:
    """(control bits, address) of a V4 QMD's second release."""
    (control,) = struct.unpack_from("<H", q, V4_STAMP[0])
    return control, struct.unpack_from("<Q", q, V4_STAMP[1])[0]


def test_make_builds_hopper_channels(dev: tuple[Any, Any]) -> None:
    d, path = dev
    assert d.arch == "sm_90" and d.sm_count == 132
    assert (d.classes.gpfifo, d.classes.compute, d.classes.copy) == (0xC86F, 0xCBC0, 0xC8B5)
    made = sorted(path.rm.objects.values())
    assert made.count(0xC86F) == 2 and 0xA06C in made and 0x9067 in made
    assert made.count(0xC8B5) == 2 and made.count(0xCBC0) == 1 and 0xC661 in made
    # The compute channel's first entry binds both classes and sets the two windows.
    first = methods(commands(d, d.compute)[0])
    assert (1, push.SET_OBJECT, [0xCBC0]) in first and (4, push.SET_OBJECT, [0xC8B5]) in first
    assert (1, push.COMPUTE_SET_SHADER_SHARED_MEMORY_WINDOW_A, list(push.hi_lo(d.windows[1]))) \
        in first
    assert 0x2080200A in path.rm.controls  # the compute boost CUDA asks for


def test_rings_and_userd_lie_in_video_memory_through_bar1(dev: tuple[Any, Any]) -> None:
    """Every channel's GPFIFO ring and USERD (NV_CHANNEL_ALLOC_PARAMS hObjectBuffer at 4,
    hUserdMemory[0] at 32, alloc_channel.h) are Mapped memory: the fence before each doorbell
    is there for their write-combined writes, and in pinned host memory a launch+wait took
    1.2 us more on the H200 (docs/results/ring-2026-12-04.txt)."""
    d, path = dev
    channels = [params for _, _, cls, params in path.rm.allocs if cls == d.classes.gpfifo]
    assert len(channels) == 2
    for params in channels:
        ring, userd = (struct.unpack_from("<I", params, at)[0] for at in (4, 32))
        assert path.live[ring].kind is Memory.MAPPED and path.live[userd].kind is Memory.MAPPED


def test_launch_writes_qmd_and_bank(dev: tuple[Any, Any]) -> None:
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(4096, Memory.DEVICE)
    point = d.launch(img["vadd"], (3, 2, 1), (64, 2, 1), (a, a, a, 77))
    words = methods(commands(d, d.compute)[-1])
    (pcas,) = [data for subc, m, data in words if m == push.COMPUTE_SEND_PCAS_A]
    qmd_address = pcas[0] << 8
    q = qmd.Qmd(qmd.V4, bytes(view(qmd_address, 384)))
    assert q.program() == img.code.gpu + img.cubin.kernels["vadd"].entry_offset
    assert (q.get("GRID_WIDTH"), q.get("GRID_HEIGHT"), q.get("CTA_THREAD_DIMENSION0"),
            q.get("CTA_THREAD_DIMENSION1")) == (3, 2, 64, 2)
    bank_address, size, valid = q.cbuf(0)
    assert valid and bank_address == qmd_address + 512
    bank = bytes(view(bank_address, size))
    assert struct.unpack_from("<3I", bank, 0) == (64, 2, 1)
    assert struct.unpack_from("<3I", bank, 0xC) == (3, 2, 1)
    assert struct.unpack_from("<3Qi", bank, 0x210) == (a.gpu, a.gpu, a.gpu, 77)
    # The QMD releases the launch's timeline value (64 bits), and the channel nothing after it.
    assert release(view(qmd_address, 384)) == (TWO_WORDS_64, d.timeline.gpu, point.value)
    assert not [d for _, m, d in words if m == push.SEM_ADDR_LO and d[4] & 7 == push.SEM_OP_RELEASE]
    # Again, through the prepared fast path: new arguments, a new QMD pointing at its bank.
    again = d.launch(img["vadd"], (3, 2, 1), (64, 2, 1), (a, a, a, 5))
    words = methods(commands(d, d.compute)[-1])
    (pcas,) = [data for subc, m, data in words if m == push.COMPUTE_SEND_PCAS_A]
    q2 = qmd.Qmd(qmd.V4, bytes(view(pcas[0] << 8, 384)))
    bank_address, size, _ = q2.cbuf(0)
    assert bank_address == (pcas[0] << 8) + 512 and pcas[0] << 8 != qmd_address
    assert struct.unpack_from("<i", bytes(view(bank_address, size)), 0x228)[0] == 5
    assert q2.program() == q.program() and q2.get("GRID_WIDTH") == 3
    assert again.value == point.value + 1
    assert release(view(pcas[0] << 8, 384)) == (TWO_WORDS_64, d.timeline.gpu, again.value)


def test_device_order_across_channels(dev: tuple[Any, Any]) -> None:
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 20, Memory.DEVICE)
    b = d.alloc(1 << 20, Memory.PINNED)
    copied = d.copy(b, a, 4096)
    launched = d.launch(img["vadd"], (1,), (1,), (a, a, a, 1))
    words = methods(commands(d, d.compute)[-1])
    acquire = words[0]
    assert acquire[1] == push.SEM_ADDR_LO and acquire[2][2] == copied.value
    assert acquire[2][4] & 7 == push.SEM_OP_ACQ_CIRC_GEQ
    assert launched.value == copied.value + 1


def test_work_the_host_saw_done_needs_no_wait_on_the_other_channel(
        dev: tuple[Any, Any]) -> None:
    """Timeline's rule: a submission waits on the GPU for the other channel's last value only
    while the host has not seen it done. A copy's entry is the copy engine's launch, then the
    release of its value, both 32-bit halves (values past 2^32 included)."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 20, Memory.DEVICE)
    b = d.alloc(1 << 20, Memory.PINNED)
    launched = d.launch(img["vadd"], (1,), (1,), (a, a, a, 1))
    copied = d.copy(b, a, 4096)  # the launch not seen done: acquired first
    first = methods(commands(d, d.copy_channel)[-1])[0]
    assert first[1] == push.SEM_ADDR_LO and first[2][2] == launched.value
    d.timeline.next = (1 << 32) + 5  # the next value's high word is 1
    path.complete()
    copied = d.copy(b, a, 4096, dst_offset=64, src_offset=128)
    assert copied.value == (1 << 32) + 5
    pitch = push.CE_SRC_PITCH | push.CE_DST_PITCH
    assert methods(commands(d, d.copy_channel)[-1]) == [
        (push.SUBC_COPY, push.CE_OFFSET_IN_UPPER, [*push.hi_lo(a.gpu + 128),
                                                   *push.hi_lo(b.gpu + 64)]),
        (push.SUBC_COPY, push.CE_LINE_LENGTH_IN, [4096]),
        (push.SUBC_COPY, push.CE_LAUNCH_DMA, [push.CE_TRANSFER_NON_PIPELINED | pitch]),
        (push.SUBC_HOST, push.SEM_ADDR_LO, [*push.lo_hi(d.timeline.gpu), 5, 1,
                                            push.SEM_OP_RELEASE | push.SEM_RELEASE_WFI
                                            | push.SEM_PAYLOAD_64BIT])]
    path.complete()
    launched = d.launch(img["vadd"], (1,), (1,), (a, a, a, 1))  # the copy seen done
    assert push.SEM_ADDR_LO not in [m for _, m, _ in methods(commands(d, d.compute)[-1])]
    copied = d.copy(b, a, 4096)
    first = methods(commands(d, d.copy_channel)[-1])[0]
    assert first[1] == push.SEM_ADDR_LO and first[2][2:4] == [launched.value & 0xFFFFFFFF, 1]


def test_step_chains_its_launches(dev: tuple[Any, Any]) -> None:
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(4096, Memory.DEVICE)
    step = d.step()
    for _ in range(3):
        step.launch(img["vadd"], (1,), (32,), (a, a, a, 32))
    step.submit()
    entry = d.compute.entries[d.compute.put - 1]
    words = methods(entry_words(entry))
    sent = [data[0] << 8 for _, m, data in words if m == push.COMPUTE_SEND_PCAS_A]
    assert len(sent) == 1  # only the first; the others follow as dependent QMDs
    first = qmd.Qmd(qmd.V4, bytes(view(sent[0], 384)))
    assert first.get("DEPENDENT_QMD0_ENABLE") == 1
    second = first.get("DEPENDENT_QMD0_POINTER") << 8
    assert qmd.Qmd(qmd.V4, bytes(view(second, 384))).get("DEPENDENT_QMD0_ENABLE") == 1
    # The step's commands end by adding one to the timeline (unsigned 64-bit IADD).
    release = [data for _, m, data in words if m == push.SEM_ADDR_LO][-1]
    assert release[2] == 1 and (release[4] >> 27) & 0xF == 5


def test_profile_stamps_each_submission_and_writes_a_chrome_trace(
        dev: tuple[Any, Any], tmp_path: Path) -> None:
    import json

    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 20, Memory.DEVICE)
    b = d.alloc(1 << 20, Memory.PINNED)
    with d.profile(capacity=8) as prof:
        d.launch(img["vadd"], (1,), (32,), (a, a, a, 32))
        d.copy(b, a, 4096)
    entry = commands(d, d.compute)[-1]
    stamps = [data for _, m, data in methods(entry)
              if m == push.SEM_ADDR_LO and data[4] & push.SEM_RELEASE_TIMESTAMP]
    base = prof.memory.gpu
    # The grid's start is stamped by the channel, waiting for no idle; its end by the QMD's
    # second release (the launch's value is its QMD's first).
    assert [s[0] | (s[1] << 32) for s in stamps] == [base]
    assert not stamps[0][4] & push.SEM_RELEASE_WFI
    assert stamp(qmd_of(entry)) == (FOUR_WORDS_64, base + 16)
    # Play the GPU: write times into the slots, then read the events back.
    slots = view(prof.memory.host, 64)
    for i, ns in enumerate((1000, 4000, 5000, 9000)):
        struct.pack_into("<Q", slots, 16 * i + 8, ns)
    path.complete()
    events = prof.events()
    assert [(e.name, e.queue, e.duration_ns) for e in events] == [
        ("vadd", "compute", 3000), ("copy", "copy", 4000)]
    trace = prof.chrome_trace(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text()) == trace
    assert [(t["name"], t["ts"], t["dur"]) for t in trace["traceEvents"]] == [
        ("vadd", 0.0, 3.0), ("copy", 4.0, 4.0)]
    assert trace["otherData"]["clock"].startswith("GPU PTIMER through the RM")
    assert d.timeline.profile is None  # the profile stopped with its block


# clcbc0.h NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_PREFETCH_SCHEDULE, re-typed here.
PREFETCH_SCHEDULE = 0x9
SEND_SIGNALING_PCAS2_B = 0x2C0


def test_every_qmd_goes_with_prefetch_schedule(dev: tuple[Any, Any]) -> None:
    """Each SEND_PCAS_A, a launch's first and through the prepared path, a step's and a run's,
    is followed by SEND_SIGNALING_PCAS2_B with PREFETCH_SCHEDULE, as tinygrad sends: on the
    H200 it cost a step's entry 1.72 us of GPU against 1.79-1.88 with NVK's
    INVALIDATE_COPY_SCHEDULE (docs/results/pcas-2026-12-04.txt)."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(4096, Memory.DEVICE)
    d.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    d.launch(img["vadd"], (1,), (32,), (a, a, a, 2))
    step = d.step()
    step.launch(img["vadd"], (1,), (32,), (a, a, a, 3))
    step.submit(times=3)  # the step's own entry, then a run of two
    entries = [int(d.compute.entries[i]) for i in range(d.compute.put)]
    entries += [int(r) for r in step.runs]
    sends = 0
    for entry in entries:
        words = methods(entry_words(entry))
        for i, (_, m, _) in enumerate(words):
            if m == push.COMPUTE_SEND_PCAS_A:
                sends += 1
                assert words[i + 1] == (1, SEND_SIGNALING_PCAS2_B, [PREFETCH_SCHEDULE])
    assert sends >= 4 + len(step.runs) - 1
