"""The GPU's retired pages (rig_nv_pci.gsp.retired, rig_nv_pci.path.vidmem.retired): asked of
GSP-RM's internal subdevice as memmgrGetBlackListPages_GA100 asks (open-gpu-kernel-modules
570.144), and never handed out by the path's heap, at PMA's 64 KiB granularity.

Against the simulated GA102, and for the allocations the simulated GB202 too
(tests/sim/retired.py answers the control, tests/sim/gsp_rm.py's page tables give the
allocations' physical addresses): random retired pages, fresh each run (the seed is in every
failure's message), checked against every page of every allocation as the simulated GPU
translates it; refusals and garbled answers fail the open naming them, the GSP stopped and
the GPU opening again."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import sim
from sim import GspFirmware, c_structs, peer_module
from sim import retired as sim_retired
from sim.gsp_rm import BAR1_PDB, BAR2_PDB, GA102_GR, RESERVED, SimRm
from support import (
    FB_SIZE,
    FMC_IMAGE,
    GB202_CLASSES,
    Opened,
    SimFunction,
    gb202_files,
    simulated_ga102,
)

from rig_edge import Memory
from rig_nv import Device
from rig_nv_pci import held
from rig_nv_pci.firmware import chips
from rig_nv_pci.gsp import retired, static_info
from rig_nv_pci.gsp.retired import RetiredPage, RetiredPagesError
from rig_nv_pci.gsp.static_info import FbRegion
from rig_nv_pci.path import vidmem

CMD = sim_retired.CTRL_GET_DYNAMIC_OFFLINED_PAGES  # the simulator's own (checked below)
KiB, MiB = 1 << 10, 1 << 20
WINDOW = 48 * MiB  # the retired pages lie in the heap's first 48 MiB, where first fit starts


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


def random_pages(seed: int, n: int, low: int = RESERVED, high: int = RESERVED + WINDOW
                 ) -> list[int]:
    """``n`` distinct 4 KiB-aligned FB addresses in ``[low, high)``, in random order."""
    pages = random.Random(seed).sample(range(low // (4 * KiB), high // (4 * KiB)), n)
    return [p * 4 * KiB for p in pages]


def test_layouts_match_the_headers() -> None:
    """NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS and bPageRetirementSupported against
    the layout tests/sim/c_structs.py computes from ctrl2080fb.h's and gsp_static_config.h's member
    lists, and against the simulated GSP-RM's hand-worked offsets."""
    size, align, leaves = c_structs.c_layout(
        "NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS")
    assert (size, align) == (retired.SIZE, 8) == (1040, 8) == (sim_retired.PARAMS_SIZE, 8)
    assert retired.ENTRY.size == leaves["offlined[1].pageNumber"][0] == 16
    assert leaves["offlined[0].pageNumber"][0] == retired.OFFLINED == 0
    assert leaves["offlined[0].source"][0] == 8
    assert "offlined[63].source" in leaves and "offlined[64].source" not in leaves
    assert retired.MAX_ENTRIES == sim_retired.PASS_ENTRIES == 64
    assert [leaves[n][0] for n in ("validEntries", "baseIndex", "bMore")] == [
        retired.VALID_ENTRIES, retired.VALID_ENTRIES + 4, retired.VALID_ENTRIES + 8] == [
        sim_retired.VALID_ENTRIES_AT, sim_retired.BASE_INDEX_AT, sim_retired.MORE_AT]
    assert retired.TAIL.size == size - retired.VALID_ENTRIES
    assert vidmem.PMA_GRANULARITY == 0x10000  # map_defines.h
    assert retired.NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES == CMD == 0x20801348
    _, _, config = c_structs.c_layout("GspStaticConfigInfo")
    assert config["bPageRetirementSupported"][0] == static_info.PAGE_RETIREMENT == 1564


def answer(pages: list[tuple[int, int]], more: int = 0, valid: int | None = None) -> bytes:
    out = bytearray(retired.SIZE)
    for i, (number, source) in enumerate(pages):
        struct.pack_into("<QB", out, 16 * i, number, source)
    struct.pack_into("<IIB", out, 1024, len(pages) if valid is None else valid, 0, more)
    return bytes(out)


def test_a_pass_decodes_to_page_addresses() -> None:
    got, more = retired.decode(answer([(0x12345, 1), (0x1, 0)], more=1))
    assert got == [RetiredPage(0x12345000, 1), RetiredPage(0x1000, 0)] and more
    assert retired.params(128)[1024:1033] == struct.pack("<IIB", 0, 128, 0)


@pytest.mark.parametrize(("reply", "message"), [
    (answer([], valid=65), r"garbled: 65 valid entries in a pass of at most 64"),
    (answer([], more=2), r"garbled: bMore 2"),
    (answer([])[:1032], r"answered 1032 bytes, not the 1040"),
])
def test_a_pass_that_cannot_be_the_struct_is_refused(reply: bytes, message: str) -> None:
    with pytest.raises(RetiredPagesError, match=message):
        retired.decode(reply)


def test_the_heap_keeps_each_retired_pages_64k_frame() -> None:
    """pmaRegisterBlacklistInfo: NV_ALIGN_DOWN64(address, PMA_GRANULARITY) for 64 KiB; a page
    outside the heap changes nothing."""
    assert vidmem.retired([0x2_1000, 0x2_F000, 0x5_0000, 0x4_0000_0000]) == [
        (0x2_0000, 64 * KiB), (0x5_0000, 64 * KiB), (0x4_0000_0000, 64 * KiB)]
    seed = fresh_seed()
    pages = random_pages(seed, 40, 0, 16 * MiB)
    frames = vidmem.retired(pages)
    h = vidmem.Heap([FbRegion(0, 16 * MiB - 1, 0, 0xFF, False, False, False)], frames)
    assert h.size == 16 * MiB - 64 * KiB * len(frames), seed
    taken = []
    while (at := h.take(4 * KiB)) is not None:
        taken.append(at)
    assert len(taken) == h.size // (4 * KiB), seed
    assert not {a // (64 * KiB) for a in taken} & {a // (64 * KiB) for a in pages}, seed
    with pytest.raises(ValueError, match="keeps back"):
        h.give(pages[0] // (4 * KiB) * 4 * KiB, 4 * KiB)


@pytest.fixture
def retiring(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Opened, int]:
    """A simulated GA102 retiring ``request.param`` random pages (fresh each run), and the
    seed that drew them."""
    seed = fresh_seed()
    opened = simulated_ga102(tmp_path, retired=random_pages(seed, request.param))
    request.addfinalizer(opened.sim_rm.stop)
    return opened, seed


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


@pytest.mark.parametrize("retiring", [23, 150], indirect=True, ids=["one-pass", "three-passes"])
def test_allocations_never_land_on_a_retired_page(retiring: tuple[Opened, int]) -> None:
    """Every page of Device and Mapped memory, as the simulated GPU translates the region's
    GPU addresses, every block of the heap (page tables, instance blocks, context buffers
    included) and every FB range registered with GSP-RM lies outside every retired page's
    64 KiB frame, while first fit runs past the retired pages; the pages were asked of
    GSP-RM's internal subdevice pass by pass."""
    opened, seed = retiring
    never_on_a_retired_page(opened.open, opened.sim_rm, opened.firmware, seed)
    assert opened.stops == [None]


@pytest.mark.parametrize("n", [23, 150], ids=["one-pass", "three-passes"])
def test_a_gb202s_allocations_never_land_on_a_retired_page(tmp_path: Path, n: int) -> None:
    """The same on the simulated GB202 (Blackwell: booted through its FSP, the page tables in
    Hopper's version-3 format), through the same open (rig_nv_pci.held.open_device), which
    asks every chip's GSP-RM for its retired pages the one way (memmgrGetBlackListPages_GA100's
    control; that GB20x's CPU-RM asks the same is not confirmed here); random pages, fresh
    each run."""
    seed = fresh_seed()
    g = sim.gb202()
    sim.SimFmc(g, FMC_IMAGE).install()
    firmware = sim.GspFirmware(g).install()
    g.usable_fb_mib = FB_SIZE >> 20
    s = SimRm(g, classes=GB202_CLASSES, gr={**GA102_GR, 0xC: 0xC00},
              retired=random_pages(seed, n)).install(firmware)
    chip = chips.identify(sim.GB202_BOOT42)
    images = held.read_images(chip, gb202_files(tmp_path))
    stops: list[BaseException | None] = []

    def open_device() -> Device:
        return held.open_device(SimFunction(g, s), name="GPU 0", chip=chip, images=images,
                                on_stopped=stops.append, timeout_s=0.2, init_timeout_s=1.0)

    s.start()
    try:
        assert s.version == 3, seed  # Blackwell's version-3 tables
        never_on_a_retired_page(open_device, s, firmware, seed)
    finally:
        s.stop()
    assert firmware.boots == 1 and firmware.failure is None, (seed, firmware.log)
    assert stops == [None] and firmware.suspended


def never_on_a_retired_page(open_device: Callable[[], Device], s: SimRm,
                            firmware: GspFirmware, seed: int) -> None:
    """Open a device of the simulated GPU retiring ``s.retired`` (drawn from ``seed``) and
    check that no allocation, heap block or registered FB range lies in a retired page's
    64 KiB frame, then stop it."""
    assert s.retired is not None
    frames = {a // (64 * KiB) for a in s.retired}
    d = open_device()
    try:
        assert isinstance(d.path, held.PciPath)
        defaults = peer_module().STATIC_DEFAULTS
        internal = defaults["hInternalSubdevice"]
        passes = -(-len(s.retired) // 64)
        assert s.retired_asked == [(internal, 64 * i) for i in range(passes)], seed
        assert firmware.peer is not None
        asked = firmware.peer.controls()
        assert [(c.client, c.obj) for c in asked if c.cmd == CMD] == [
            (defaults["hInternalClient"], internal)] * passes, seed
        rng = random.Random(seed)
        regions = []
        while sum(r.length for r in regions) < WINDOW + 16 * MiB:
            size = rng.choice([4 * KiB, 12 * KiB, 64 * KiB, 192 * KiB, 2 * MiB, 3 * MiB])
            kind = Memory.MAPPED if rng.random() < 0.2 else Memory.DEVICE
            r = d.alloc(size, kind)
            assert r is not None, seed
            regions.append(r)
        highest = 0
        for r in regions:
            for offset in range(0, r.length, 4 * KiB):
                where = s.translate(r.gpu + offset)
                assert where.video and where.address // (64 * KiB) not in frames, (
                    seed, hex(where.address))
                highest = max(highest, where.address)
        assert highest > max(s.retired), seed  # the allocations ran past every retired page
        heap = d.path.heap
        kept = vidmem.retired(s.retired)
        assert kept_frames(d) == kept, seed
        assert all(not overlaps(f, r) for f in kept for r in heap.free), seed
        used = vidmem.without(heap.ranges, heap.free)
        assert used and all(not overlaps(f, u) for f in kept for u in used), seed
        assert all(not overlaps(f, fb) for f in kept for fb in s.fbmem.values()), seed
        d.upload(regions[0], b"past the retired pages")
        assert bytes(d.download(regions[0], 22)) == b"past the retired pages"
    finally:
        d.stop()


@pytest.fixture
def ga102(tmp_path: Path, request: pytest.FixtureRequest) -> Opened:
    opened = simulated_ga102(tmp_path, retired=random_pages(fresh_seed(), 100))
    request.addfinalizer(opened.sim_rm.stop)
    return opened


def kept_frames(d: Device) -> list[tuple[int, int]]:
    """What the device's heap keeps back besides GSP-RM's BAR 1 and BAR 2 roots."""
    assert isinstance(d.path, held.PciPath)
    roots = vidmem.roots(BAR1_PDB, BAR2_PDB)
    return sorted(k for k in d.path.heap.kept if k not in roots)


def test_a_gpu_without_page_retirement_is_not_asked(tmp_path: Path) -> None:
    """bPageRetirementSupported clear: gpuCheckPageRetirementSupport_GSPCLIENT says no, and
    CPU-RM asks nothing."""
    opened = simulated_ga102(tmp_path)
    try:
        d = opened.open()
        assert kept_frames(d) == [] and opened.sim_rm.retired_asked == []
        d.stop()
    finally:
        opened.sim_rm.stop()


@pytest.mark.parametrize("status", [0x56, 0x57], ids=["NOT_SUPPORTED", "OBJECT_NOT_FOUND"])
def test_none_to_list_opens_with_no_page_kept(ga102: Opened, status: int) -> None:
    """NV_ERR_NOT_SUPPORTED and NV_ERR_OBJECT_NOT_FOUND are "No blacklisted pages" to
    memmgrGetBlackListPages_GA100: the open goes on with nothing kept back."""
    ga102.firmware.peer_kw["control_status"] = {CMD: status}
    d = ga102.open()
    assert kept_frames(d) == []
    d.stop()
    assert ga102.stops == [None]


def refused_then_reopens(ga102: Opened, message: str) -> None:
    with pytest.raises(RetiredPagesError, match=message):
        ga102.open()
    assert ga102.stops == [None] and ga102.firmware.suspended  # the GSP was stopped
    for key in ("control_status", "control_answer", "on_control"):
        ga102.firmware.peer_kw.pop(key, None)
    ga102.firmware.peer_kw.update(ga102.sim_rm.peer_kw())
    d = ga102.open()
    assert kept_frames(d) == vidmem.retired(ga102.sim_rm.retired or [])
    d.stop()


WHAT = r"^GPU 0: NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES \(the GPU's retired pages\) "


@pytest.mark.parametrize("in_header", [True, False], ids=["rpc_result-too", "params-only"])
def test_another_refusal_fails_the_open_naming_it(ga102: Opened, in_header: bool) -> None:
    ga102.firmware.peer_kw["control_status"] = {CMD: 0x1B}
    ga102.firmware.peer_kw["status_in_header"] = in_header
    refused_then_reopens(ga102, WHAT + r"was refused: NV_ERR_INSUFFICIENT_PERMISSIONS \(0x1b\)")


def test_a_refusal_after_a_pass_said_more_fails_the_open(ga102: Opened) -> None:
    serve: Callable[[int, int, bytes], tuple[int, bytes] | None]
    serve = ga102.firmware.peer_kw["on_control"]  # the simulated GSP-RM's, which it installed

    def second_pass_refused(obj: int, cmd: int, params: bytes) -> tuple[int, bytes] | None:
        if cmd == CMD and params[1028:1032] != bytes(4):
            return 0x57, params
        return serve(obj, cmd, params)

    ga102.firmware.peer_kw["on_control"] = second_pass_refused
    refused_then_reopens(ga102, WHAT + r"was refused at baseIndex 64, after a pass said there "
                                       r"were more: NV_ERR_OBJECT_NOT_FOUND")


@pytest.mark.parametrize(("garble", "message"), [
    (lambda p: p[:1024] + struct.pack("<I", 65) + p[1028:], r"is garbled: 65 valid entries"),
    (lambda p: p[:1032] + b"\x07" + p[1033:], r"is garbled: bMore 7"),
    (lambda p: p[:1032] + b"\x01" + p[1033:], r"is garbled: more than 512 pages"),
], ids=["entries", "bMore", "endless"])
def test_a_garbled_answer_fails_the_open_naming_it(ga102: Opened, garble: object,
                                                   message: str) -> None:
    ga102.firmware.peer_kw["control_answer"] = {CMD: garble}
    refused_then_reopens(ga102, WHAT + message)
