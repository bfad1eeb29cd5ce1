"""Peer mappings: a region of one device mapped into another GPU's address space (issue 10).

The mapping lies at the address the memory has on its own GPU, so the mapper's copies and
kernels use it as they use their own memory. Both devices' memory (:class:`rig_nv.memory.Heap`)
keeps a record: the mapper what it borrows (region -> owner), the owner what it lends (region
-> mappers). The owner's ``free`` refuses a region that is lent; either device's ``stop`` ends
the mappings it is part of first. No lock of one device is held while the other's is taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rig_edge import Misuse, Region, RigError
from rig_nv import checks

if TYPE_CHECKING:
    from rig_nv.memory import Heap


def map_peer(mine: Heap, owner: Heap, region: Region) -> Region:
    """Map ``owner``'s whole region ``region`` into ``mine``'s GPU; the region ``mine`` uses.
    (:meth:`rig_nv.Device.map_peer` checks that ``owner`` is another open device.)"""
    region = checks.region_of("map_peer's region", region)
    mine.health.check()
    owner.health.check()
    a = owner.allocation(region)
    if a is None:
        raise Misuse(f"{region} is no region that {owner.name}'s alloc made and that "
                     "is live (map_peer maps a whole region, of the device that made it)")
    if mine.borrowed(region):
        raise Misuse(f"{region} of {owner.name} is mapped into {mine.name} "
                     "already: use that region")
    p = mine.path.map_peer(a, owner.path)
    if not owner.lend(region, a, mine):  # freed or stopped meanwhile: the mapping must not
        mine.path.unmap_peer(p)          # outlive it
        raise Misuse(f"{region} of {owner.name} was freed while it was being mapped")
    mine.borrow(region, p, owner)
    return region


def unmap_peer(mine: Heap, region: Region) -> None:
    """End ``mine``'s mapping of another device's ``region`` (the device's ``free`` of it)."""
    got = mine.unborrow(region)
    if got is None:
        raise Misuse(f"{region} is not mapped into {mine.name}")
    owner, p = got
    try:
        mine.path.unmap_peer(p)
    except BaseException:
        mine.borrow(region, p, owner)  # still mapped: still mine's, for stop to end
        raise
    owner.unlend(region, mine)


def end_all(mine: Heap) -> BaseException | None:
    """At a device's stop: end the mappings it holds of others' memory and those others hold
    of its own. Returns the first failure (the rest are still tried)."""
    failed: BaseException | None = None
    for region in mine.peers_in():
        try:
            unmap_peer(mine, region)
        except RigError as e:
            failed = failed or e
            # the mapping is UVM's to end with the process; not this device's memory
            mine.unborrow(region)
    for region, mappers in mine.peers_out().items():
        for m in mappers:
            try:
                if m.borrowed(region):
                    unmap_peer(m, region)
            except RigError as e:
                failed = failed or e
    mine.forget_lent()
    return failed
