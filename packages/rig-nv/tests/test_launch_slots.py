"""Launch slots (rig_nv.launch.Slots) on the stand-in: a configuration launched again keeps its
QMD and bank in video memory and writes only its arguments there, round robin over its slots
while the GPU is done with them, through the launch arena otherwise."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from fake_gpu import FakePath, entry_words
from test_device_cpu import V4_RELEASE

from rig_edge import Memory
from rig_nv import launch as launching
from rig_nv import push, qmd

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"


def _vadd(d: Any, path: FakePath) -> tuple[Any, Any, Any]:
    """vadd, a region for it, and its (2,) x (64,) configuration, prepared by a first launch
    (through the arena) after everything before is done."""
    fn = d.load(CUBIN.read_bytes())["vadd"]
    a = d.alloc(1 << 16, Memory.DEVICE)
    path.complete()
    d.launch(fn, (2,), (64,), (a, a, a, 0))
    return fn, a, fn.prepared[((2,), (64,), 0, d.loader.slm)]


def sent_qmds(d: Any, since: int) -> list[int]:
    """The QMD addresses of the compute channel's GPFIFO entries from ``since`` on (each
    entry's SEND_PCAS_A: the word after its header, shifted by 8)."""
    ch, out = d.compute, []
    send = push.header(push.SUBC_COMPUTE, push.COMPUTE_SEND_PCAS_A, 1)
    for i in range(since, ch.put):
        body = entry_words(int(ch.entries[i % ch.count]))  # the pushbuffer's or a slot's
        out.append(body[body.index(send) + 1] << 8)
    return out


def test_a_configuration_launched_again_uses_its_slots_round_robin(
        dev: tuple[Any, FakePath]) -> None:
    d, path = dev
    fn = d.load(CUBIN.read_bytes())["vadd"]
    a = d.alloc(1 << 16, Memory.DEVICE)
    path.complete()
    d.launch(fn, (2,), (64,), (a, a, a, 0))  # prepares the configuration (the arena)
    prep = fn.prepared[((2,), (64,), 0, d.loader.slm)]
    head, put = d.timeline.arena.head, d.compute.put
    for i in range(2 * launching.SLOTS):
        d.launch(fn, (2,), (64,), (a, a, a, i + 1))
        path.complete()
    assert d.timeline.arena.head == head  # nothing more went through the arena
    addresses = sent_qmds(d, put)
    at = [d.timeline.pool.gpu + o for o in prep.slots.at]
    assert addresses == at + at and len(set(at)) == launching.SLOTS
    params = fn.kernel.param_offset
    for k, o in enumerate(prep.slots.at):
        # each slot's QMD names the bank behind it, and the bank holds the last launch's n
        layout = qmd.LAYOUTS[d.classes.qmd_version]
        q = qmd.Qmd(layout, bytes(d.timeline.pool.view[o : o + layout.size]))
        assert q.cbuf(0)[0] == d.timeline.pool.gpu + o + 512
        n = struct.unpack_from("<i", d.timeline.pool.view, o + 512 + params + 24)[0]
        assert n == launching.SLOTS + k + 1


def test_a_launch_from_a_slot_is_an_entry_naming_the_slots_own_words(
        dev: tuple[Any, FakePath]) -> None:
    """Slots: after compute work seen done a launch from a slot takes no pushbuffer space; its
    GPFIFO entry names the words behind the slot's QMD that send that QMD. Behind a launch
    not seen done it goes through the pushbuffer, the order's acquire of that launch first."""
    d, path = dev
    fn, a, prep = _vadd(d, path)
    d.launch(fn, (2,), (64,), (a, a, a, 0))  # makes the slots, through the pushbuffer
    pool, ch = d.timeline.pool, d.compute
    for i in range(1, launching.SLOTS + 2):
        path.complete()
        head = ch.arena.head
        p = d.launch(fn, (2,), (64,), (a, a, a, i + 1))
        at = pool.gpu + prep.slots.at[i % launching.SLOTS]
        entry = int(ch.entries[(ch.put - 1) % ch.count])
        assert ch.arena.head == head  # the pushbuffer untouched
        assert entry & 0xFF_FFFF_FFFC == at + launching.SEND_AT
        assert entry_words(entry) == list(push.send_qmd_words(at))
        assert struct.unpack_from("<QQ", pool.view, at - pool.gpu + V4_RELEASE[1]) == (
            d.timeline.gpu, p.value)
    p = d.launch(fn, (2,), (64,), (a, a, a, 99))  # the one before not seen done
    body = entry_words(int(ch.entries[(ch.put - 1) % ch.count]))
    assert ch.pb.gpu <= int(ch.entries[(ch.put - 1) % ch.count]) & 0xFF_FFFF_FFFC < (
        ch.pb.gpu + ch.pb.length)
    assert body[0] == push.header(push.SUBC_HOST, push.SEM_ADDR_LO, 5) and body[3] == p.value - 1
    assert body[-4:] == list(push.send_qmd_words(pool.gpu + prep.slots.at[2]))


def test_a_slot_the_gpu_still_reads_is_not_written_the_launch_takes_the_arena(
        dev: tuple[Any, FakePath]) -> None:
    d, path = dev
    fn, a, prep = _vadd(d, path)
    d.launch(fn, (2,), (64,), (a, a, a, 1))  # makes the slots, uses the first
    # the GPU does nothing more: the other slots are free, then the first is busy
    for i in range(launching.SLOTS - 1):
        d.launch(fn, (2,), (64,), (a, a, a, 2 + i))
    busy = bytes(d.timeline.pool.view[prep.slots.at[0] : prep.slots.at[0] + 1024])
    head, put = d.timeline.arena.head, d.compute.put
    d.launch(fn, (2,), (64,), (a, a, a, 99))
    assert bytes(d.timeline.pool.view[prep.slots.at[0] : prep.slots.at[0] + 1024]) == busy
    assert d.timeline.arena.head > head and sent_qmds(d, put) == [d.timeline.arena.ring.gpu + head
                                                           + (-head) % 256]
    assert prep.slots.turn == 0  # still waiting for the first
    path.complete()
    d.launch(fn, (2,), (64,), (a, a, a, 100))
    assert prep.slots.turn == 1


def test_a_full_slot_pool_leaves_configurations_to_the_arena(
        dev: tuple[Any, FakePath]) -> None:
    d, path = dev
    fn = d.load(CUBIN.read_bytes())["vadd"]
    a = d.alloc(1 << 16, Memory.DEVICE)
    path.complete()
    d.timeline.pool_head = d.timeline.pool.length - 1024  # nearly full
    d.launch(fn, (2,), (64,), (a, a, a, 0))
    d.launch(fn, (2,), (64,), (a, a, a, 1))
    prep = fn.prepared[((2,), (64,), 0, d.loader.slm)]
    assert prep.slots.turn == -1 and prep.slots.at == []
    head = d.timeline.arena.head
    d.launch(fn, (2,), (64,), (a, a, a, 2))
    assert d.timeline.arena.head > head
