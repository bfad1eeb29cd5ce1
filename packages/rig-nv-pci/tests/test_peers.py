"""Peer mappings between two GPUs opened over PCI (issue 8): ``d1.map_peer(d0, region)`` on two
simulated GA102s on one simulated machine.

The machine is two things at once: a fixture sysfs tree whose rig_pci functions the test
takes (a switch with a GPU below each downstream port, a GPU bound to vfio-pci, a GPU whose
BAR 1 is smaller than its memory, a GPU on another root port), which is what the path asks
rig_pci.memory.why_apart and rig_pci.memory.bus about; and the simulated GPUs behind them,
which share one sim.HostMemory (the machine's memory and bus), each GPU's BAR 1 at the bus
address its fixture function shows. A copy engine whose PTE names system memory at the
other GPU's BAR 1 reaches that GPU's video memory through its BAR 1 tables (sim/gsp_rm.py),
so every copy below goes through both GPUs' page tables and the bus.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sim
from sim import gmmu
from sim.gsp_rm import SimRm
from support import FB_SIZE, FMC_IMAGE, GB202_CLASSES, SimFunction, gb202_files, simulated_ga102

from rig_edge import Memory, Misuse, RigError
from rig_nv import Device
from rig_nv_pci import held
from rig_nv_pci.firmware import chips
from rig_nv_pci.path.pci import PciPath
from rig_pci import Function, Machine
from rig_pci.sysfs import SysfsTransport
from rig_pci.testing import FakeVfio, add_function, add_vfio, config_space

GiB = 1 << 30
BUS0, BUS1 = "0000:03:00.0", "0000:04:00.0"  # below one switch
VFIO_BUS, SMALL_BUS = "0000:05:00.0", "0000:06:00.0"  # below it too
ROOT_BUS = "0000:08:00.0"  # on another root port
BAR1 = {BUS0: 0x38_0000_0000, BUS1: 0x3A_0000_0000, VFIO_BUS: 0x3C_0000_0000,
        SMALL_BUS: 0x3E_0000_0000, ROOT_BUS: 0x40_0000_0000}
BAR1_SIZE = dict.fromkeys(BAR1, FB_SIZE) | {SMALL_BUS: FB_SIZE // 2}
VFIO_GROUP = 12
R, W, MMAP = 1, 2, 4  # VFIO_REGION_INFO_FLAG_READ, _WRITE, _MMAP (linux/vfio.h)


def bridge(root: Path, address: str, parent: str | None) -> None:
    """A PCIe port whose ACS control has Source Validation only (no redirect: pci_regs.h,
    extended capability 0x000d at 0x100, control at +6)."""
    cfg = bytearray(config_space(0x8086, 0x1234, 0x060400).ljust(4096, b"\0"))
    struct.pack_into("<IHH", cfg, 0x100, 0x0001_000D, 0x005F, 0x0001)
    add_function(root, address, vendor=0x8086, device=0x1234, class_code=0x060400,
                 parent=parent, config=bytes(cfg))


def gpu_function(root: Path, address: str, parent: str, **kwargs: object) -> None:
    add_function(root, address, vendor=0x10DE, device=0x2204, class_code=0x030200,
                 bars={0: (0xF000_0000, 16 << 20, False),
                       1: (BAR1[address], BAR1_SIZE[address], True)},
                 parent=parent, **kwargs)  # type: ignore[arg-type]


def fixture_machine(root: Path) -> Machine:
    """Root port 00:01.0, switch 01:00.0, downstream ports 02:0N.0 with GPU 03..06:00.0 below
    them (05 bound to vfio-pci), and root port 00:02.0 with GPU 08:00.0: this machine (its
    memory the process's), VFIO answered by a fake kernel."""
    bridge(root, "0000:00:01.0", None)
    bridge(root, "0000:01:00.0", "0000:00:01.0")
    for i, bus in enumerate((BUS0, BUS1, VFIO_BUS, SMALL_BUS)):
        bridge(root, f"0000:02:0{i}.0", "0000:01:00.0")
        extra = {"driver": "vfio-pci", "iommu_group": VFIO_GROUP} if bus == VFIO_BUS else {}
        gpu_function(root, bus, f"0000:02:0{i}.0", **extra)
    bridge(root, "0000:00:02.0", None)
    gpu_function(root, ROOT_BUS, "0000:00:02.0")
    add_vfio(root, VFIO_GROUP)
    device = root / "vfio-device"
    with open(device, "wb") as f:
        f.truncate(8 << FakeVfio.REGION_SHIFT)
        f.seek(7 << FakeVfio.REGION_SHIFT)
        f.write(config_space(0x10DE, 0x2204, 0x030200))
    fake = FakeVfio(device, regions={0: (R | W | MMAP, 16 << 20), 1: (R | W, 4 << 20),
                                     7: (R | W, 256)})
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/self/pagemap").touch()
    return Machine(SysfsTransport(root, shares_memory=True, ioctl=fake))


@dataclass
class Gpu:
    """One simulated GPU of the machine: what opens it, its rig_pci function, its device."""

    sim_rm: SimRm
    taken: SimFunction  # the simulated GPU as the open takes it (its BARs, its DMA)
    chip: chips.Chip
    files: dict[str, os.PathLike[str]]
    function: Function
    device: Device | None = None
    stops: list[BaseException | None] = field(default_factory=list)

    @property
    def d(self) -> Device:
        assert self.device is not None
        return self.device

    @property
    def path(self) -> PciPath:
        assert isinstance(self.d.path, PciPath)
        return self.d.path

    def open(self) -> Device:
        """Open (again) the simulated GPU, its path given its rig_pci function."""
        self.device = held.open_device(self.taken, name=self.function.bus, chip=self.chip,
                                       images=held.read_images(self.chip, self.files),
                                       on_stopped=self.stops.append, timeout_s=0.2,
                                       init_timeout_s=1.0, function=self.function)
        return self.device

    def root(self) -> int:
        """The address space's root, as the simulated GSP-RM was handed it."""
        return list(self.sim_rm.roots.values())[-1]

    def pte(self, va: int) -> int:
        """The PTE this GPU's MMU finds for ``va`` (sim/gmmu.py)."""
        return gmmu.pte(self.sim_rm.read64, self.root(), va, self.sim_rm.version)[0]


def ga102(tmp: Path, host: sim.HostMemory, bus: str) -> tuple[SimRm, SimFunction, chips.Chip,
                                                               dict[str, os.PathLike[str]]]:
    """A simulated GA102 on the machine of ``host``, its BAR 1 where ``bus`` shows it."""
    o = simulated_ga102(tmp, host=host, bar1_address=BAR1[bus], fb_size=FB_SIZE,
                        bar1_size=BAR1_SIZE[bus])
    return o.sim_rm, o.function, chips.identify(o.rig.gpu.boot42), o.files


def gb202(tmp: Path, host: sim.HostMemory, bus: str) -> tuple[SimRm, SimFunction, chips.Chip,
                                                               dict[str, os.PathLike[str]]]:
    """A simulated GB202 (Hopper's version-3 page tables) as test_held boots one, on the
    machine of ``host``."""
    g = sim.gb202(host)
    g.bar1_address = BAR1[bus]
    sim.SimFmc(g, FMC_IMAGE).install()
    firmware = sim.GspFirmware(g).install()
    g.usable_fb_mib = FB_SIZE >> 20
    s = SimRm(g, classes=GB202_CLASSES, gr={**sim.gsp_rm.GA102_GR, 0xC: 0xC00},
              fb_size=FB_SIZE, bar1_size=BAR1_SIZE[bus]).install(firmware).start()
    return s, SimFunction(g, s), chips.identify(sim.GB202_BOOT42), gb202_files(tmp)


@contextmanager
def two(tmp: Path, buses: tuple[str, str] = (BUS0, BUS1), chip: str = "ga102"
        ) -> Iterator[tuple[Gpu, Gpu]]:
    """Two simulated GPUs of ``chip`` on one machine, opened; stopped (if not yet) and given
    back after."""
    machine = fixture_machine(tmp / "machine")
    host = sim.HostMemory()
    gpus: list[Gpu] = []
    with ExitStack() as stack:
        for i, bus in enumerate(buses):
            s, taken, identified, files = (ga102 if chip == "ga102" else gb202)(
                tmp / f"gpu{i}", host, bus)
            stack.callback(s.stop)
            f = Function.take(machine, bus)
            stack.callback(f.close)
            taken.maps_host = f.maps_host  # behind an IOMMU as its function is
            g = Gpu(s, taken, identified, files, f)
            g.open()
            stack.callback(lambda g=g: g.d.stop())
            gpus.append(g)
        yield gpus[0], gpus[1]


def unmapped(g: Gpu, va: int) -> bool:
    """Whether ``g``'s MMU (its TLB, then its tables) maps nothing at ``va``."""
    try:
        g.sim_rm.translate(va)
    except gmmu.MmuFault:
        return True
    return False


def bits(entry: int, hi: int, lo: int) -> int:
    return entry >> lo & (1 << hi - lo + 1) - 1


SYSTEM_COHERENT, SYSTEM_NON_COHERENT = 2, 3  # NV_MMU_VER2/VER3_PTE_APERTURE


def decoded(entry: int, version: int) -> tuple[int, bool, int, int]:
    """A PTE's aperture, whether the GPU's L2 leaves it uncached, its kind and its address:
    version 2 APERTURE 2:1, VOL 3:3, KIND 63:56, ADDRESS_SYS 53:8 (>> 12) (dev_mmu.ref.txt);
    version 3 APERTURE 2:1, PCF 7:3 (REGULAR_RW_ATOMIC_UNCACHED_ACE 1), KIND 11:8, ADDRESS
    51:12 in place (hopper/gh100/dev_mmu.h)."""
    if version == 2:
        return bits(entry, 2, 1), bool(bits(entry, 3, 3)), bits(entry, 63, 56), \
            bits(entry, 53, 8) << 12
    return bits(entry, 2, 1), bits(entry, 7, 3) == 1, bits(entry, 11, 8), \
        bits(entry, 51, 12) << 12


# ---- copies both ways ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Memory.DEVICE, Memory.MAPPED, Memory.PINNED])
@pytest.mark.parametrize("n", [0x5123, (2 << 20) + 0x3000], ids=["small-pages", "huge-pages"])
@pytest.mark.parametrize("chip", ["ga102", "gb202"])
def test_copies_both_ways_round_trip_random_bytes(tmp_path: Path, kind: Memory, n: int,
                                                  chip: str) -> None:
    """GPU 1's copy engine reads GPU 0's region through the peer mapping and writes it back;
    then the same with the GPUs' parts swapped. The mapper's PTEs name the owner's BAR 1 bus
    addresses as non-coherent, uncached system memory of kind GENERIC (NVIDIA's BAR1 P2P), in
    the version-2 format (GA102) and Hopper's version 3 (GB202); Pinned memory is the
    machine's, mapped at its own bus addresses, coherent."""
    with two(tmp_path, chip=chip) as (g0, g1):
        for owner, mapper in ((g0, g1), (g1, g0)):
            there = os.urandom(n)
            r = owner.d.alloc(n, kind)
            assert r is not None
            owner.d.upload(r, there).wait(timeout_s=5.0)
            requests = owner.sim_rm.bar1.requests
            p = mapper.d.map_peer(owner.d, r)
            assert p == r and p.gpu == r.gpu  # the owner's address, in the mapper's space
            local = mapper.d.alloc(n, Memory.DEVICE)
            assert local is not None
            mapper.d.copy(local, p, engine="copy").wait(timeout_s=5.0)
            assert bytes(mapper.d.download(local)) == there, "peer read"
            back = os.urandom(n)
            mapper.d.upload(local, back).wait(timeout_s=5.0)
            mapper.d.copy(p, local, engine="copy").wait(timeout_s=5.0)
            assert bytes(owner.d.download(r)) == back, "peer write"

            entry = mapper.pte(p.gpu + n - 1)
            aperture, uncached, pte_kind, address = decoded(entry, mapper.sim_rm.version)
            a = owner.d.memory.regions()[r]
            if kind is Memory.PINNED:  # the owner's own pages, as the owner maps them
                assert aperture == SYSTEM_COHERENT and not uncached
                assert entry == owner.pte(p.gpu + n - 1)
                assert owner.sim_rm.bar1.requests == requests
            else:  # the owner's BAR 1, through its tables
                assert aperture == SYSTEM_NON_COHERENT and uncached
                assert pte_kind == 0x06  # NV_MMU_PTE_KIND_GENERIC_MEMORY
                undo = mapper.d.memory.regions()[p].undo
                at = a.undo.bar1 if kind is Memory.MAPPED else undo.lent[1]
                assert (undo.lent is None) == (kind is Memory.MAPPED)
                page = (p.gpu + n - 1) & ~0xFFF if n < (2 << 20) else p.gpu + (2 << 20)
                assert address == BAR1[owner.function.bus] + at + page - p.gpu
                assert owner.sim_rm.bar1.requests > requests
            assert a.undo.huge == (n >= 2 << 20 and kind is not Memory.PINNED)
            mapper.d.free(p)
            assert unmapped(mapper, p.gpu) and unmapped(mapper, p.gpu + n - 1)
            owner.d.free(r)
            mapper.d.free(local)


# ---- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(("bus", "why"), [
    (VFIO_BUS, f"{VFIO_BUS} is taken through VFIO, not physically"),
    (SMALL_BUS, f"{SMALL_BUS} BAR 1 shows 0x{FB_SIZE // 2:x} bytes of its 0x{FB_SIZE:x}"),
    (ROOT_BUS, "{mapper} and {owner} meet only in the root complex"),
], ids=["vfio", "small-bar", "root-complex"])
def test_refused_naming_why_the_gpus_do_not_reach_each_other(
    tmp_path: Path, bus: str, why: str,
) -> None:
    """rig_pci.memory.why_apart's reason, both ways, for every kind; nothing changes: no
    mapping, no BAR 1 range lent, the owner frees its region."""
    with two(tmp_path, (BUS0, bus)) as (g0, g1):
        for owner, mapper in ((g0, g1), (g1, g0)):
            for kind in Memory:
                r = owner.d.alloc(0x3000, kind)
                assert r is not None
                bar1 = list(owner.path.bar1.offsets.free)
                with pytest.raises(RigError) as e:
                    mapper.d.map_peer(owner.d, r)
                reason = why.format(mapper=mapper.function.bus, owner=owner.function.bus)
                assert str(e.value) == (f"{mapper.path.name}: {owner.path.name}'s memory cannot "
                                        f"be mapped here: {reason}")
                assert not isinstance(e.value, Misuse)
                assert unmapped(mapper, r.gpu) and owner.path.bar1.offsets.free == bar1
                assert not owner.d.memory.peers_out() and not mapper.d.memory.peers_in()
                owner.d.free(r)


def test_refused_for_an_owner_not_opened_over_pci_or_with_no_function(tmp_path: Path) -> None:
    with two(tmp_path) as (g0, g1):
        r = g0.d.alloc(0x1000, Memory.DEVICE)
        assert r is not None
        a = g0.d.memory.regions()[r]
        with pytest.raises(RigError, match="must be opened over PCI too, not through object"):
            g1.path.map_peer(a, object())
        g0.path.function = None
        with pytest.raises(RigError, match=f"{g0.path.name}'s path was not given its PCI "
                           "function"):
            g1.d.map_peer(g0.d, r)
        assert unmapped(g1, r.gpu)


def test_device_memory_is_refused_where_the_owners_bar1_has_no_room(tmp_path: Path) -> None:
    with two(tmp_path) as (g0, g1):
        r = g0.d.alloc(0x2000, Memory.DEVICE)
        assert r is not None
        addresses = g0.path.bar1.offsets
        left = list(addresses.free)
        for at, size in left:  # all of BAR 1 that is left, taken behind the path
            assert addresses.take(size, 0x1000) == at
        with pytest.raises(RigError, match=f"{BUS1}: {BUS0}'s BAR 1 has no room for the "
                           "0x2000 bytes"):
            g1.d.map_peer(g0.d, r)
        assert unmapped(g1, r.gpu) and not g0.d.memory.peers_out()
        for at, size in left:
            addresses.give(at, size)
        p = g1.d.map_peer(g0.d, r)  # with room again
        g1.d.free(p)


# ---- unmap, free and stop --------------------------------------------------------------------


def test_unmap_ends_the_mapping_and_a_copy_of_it_is_refused(tmp_path: Path) -> None:
    """The mapper's free of a peer region: its PTEs cleared and its TLB invalidated (its MMU
    no longer reaches the owner), the owner's BAR 1 range lent for it unmapped and given back
    (a request there reaches nothing), and the region is no longer the mapper's (its copy is
    Misuse, as on the kernel path); the owner's free, refused while mapped, then works."""
    with two(tmp_path) as (g0, g1):
        data = os.urandom(0x4000)
        r = g0.d.alloc(len(data), Memory.DEVICE)
        assert r is not None
        g0.d.upload(r, data).wait(timeout_s=5.0)
        bar1 = list(g0.path.bar1.offsets.free)
        p = g1.d.map_peer(g0.d, r)
        lent = g1.d.memory.regions()[p].undo.lent[1]
        local = g1.d.alloc(len(data), Memory.DEVICE)
        assert local is not None
        g1.d.copy(local, p, engine="copy").wait(timeout_s=5.0)  # fills the TLBs
        assert g0.path.bar1.offsets.free != bar1
        with pytest.raises(Misuse, match="mapped into"):
            g0.d.free(r)
        g1.d.free(p)
        assert unmapped(g1, p.gpu)
        with pytest.raises(LookupError, match="maps nothing"):
            g0.sim_rm.bar1.request(BAR1[BUS0] + lent, 8)
        assert g0.path.bar1.offsets.free == bar1
        with pytest.raises(Misuse, match="not a live region"):
            g1.d.copy(local, p, engine="copy")
        assert bytes(g0.d.download(r)) == data  # the owner's memory is as it was
        g0.d.free(r)


@pytest.mark.parametrize("first", ["owner", "mapper"])
def test_a_stop_of_either_first_ends_the_mapping(tmp_path: Path, first: str) -> None:
    """The owner's stop ends the mapper's mapping first (the mapper's MMU no longer reaches
    it) and the mapper goes on; the mapper's stop ends its mapping and gives the owner's BAR 1
    range back, and the owner goes on. Both stops stop their GSPs cleanly; a stopped owner
    opens again and is mapped again."""
    with two(tmp_path) as (g0, g1):
        data = os.urandom(0x3000)
        r = g0.d.alloc(len(data), Memory.DEVICE)
        assert r is not None
        g0.d.upload(r, data).wait(timeout_s=5.0)
        bar1 = list(g0.path.bar1.offsets.free)
        p = g1.d.map_peer(g0.d, r)
        local = g1.d.alloc(len(data), Memory.DEVICE)
        assert local is not None
        g1.d.copy(local, p, engine="copy").wait(timeout_s=5.0)
        if first == "owner":
            g0.d.stop()
            assert g0.stops == [None]
            assert not g1.d.memory.peers_in() and p not in g1.d.memory.regions()
            assert unmapped(g1, p.gpu)
            with pytest.raises(Misuse):
                g1.d.copy(local, p, engine="copy")
            more = os.urandom(len(data))
            g1.d.upload(local, more).wait(timeout_s=5.0)
            assert bytes(g1.d.download(local)) == more
            d0 = g0.open()  # GPU 0 opens again; its memory is mapped again
            r = d0.alloc(len(data), Memory.DEVICE)
            assert r is not None
            d0.upload(r, data).wait(timeout_s=5.0)
            p = g1.d.map_peer(d0, r)
            g1.d.copy(local, p, engine="copy").wait(timeout_s=5.0)
            assert bytes(g1.d.download(local)) == data
        else:
            g1.d.stop()
            assert g1.stops == [None]
            assert not g0.d.memory.peers_out() and g0.path.bar1.offsets.free == bar1
            g0.d.free(r)
            again = g0.d.alloc(len(data), Memory.DEVICE)
            assert again is not None
            g0.d.upload(again, data).wait(timeout_s=5.0)
            assert bytes(g0.d.download(again)) == data
