"""Peer mappings: a region of one device mapped into another GPU's address space (issue 10).

The mapping lies at the address the memory has on its own GPU, so the mapper's copies and
kernels use it as they use their own memory. Both devices keep a record: the mapper what it
maps (``_peer_in``: region -> owner), the owner what others map of it (``_peer_out``: region
-> mappers). The owner's ``free`` refuses a region that is mapped elsewhere; either device's
``stop`` ends the mappings it is part of first. No lock of one device is held while the
other's is taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rig_edge import Misuse, Region, RigError
from rig_nv import checks

if TYPE_CHECKING:
    from rig_nv.device import Device


def map_peer(d: Device, owner: Device, region: Region) -> Region:
    """Map ``owner``'s whole region ``region`` into ``d``'s GPU; the region ``d`` uses."""
    from rig_nv.device import Device

    if not isinstance(owner, Device):
        raise Misuse(f"map_peer's owner must be a rig_nv.Device, not {type(owner).__name__}")
    if owner is d:
        raise Misuse(f"{region} is {d.facts.name}'s own: map_peer maps another device's region")
    region = checks.region_of("map_peer's region", region)
    d._check()
    owner._check()
    with owner._lock:
        a = owner._allocs.get(region)
        if a is None or region in owner._peer_in:
            raise Misuse(f"{region} is no region that {owner.facts.name}'s alloc made and that "
                         "is live (map_peer maps a whole region, of the device that made it)")
    with d._lock:
        if region in d._peer_in:
            raise Misuse(f"{region} of {owner.facts.name} is mapped into {d.facts.name} "
                         "already: use that region")
    p = d.path.map_peer(a, owner.path)
    with owner._lock:
        alive = not owner._stopped and owner._allocs.get(region) is a
        if alive:
            owner._peer_out.setdefault(region, set()).add(d)
    if not alive:  # freed or stopped meanwhile: the mapping must not outlive it
        d.path.unmap_peer(p)
        raise Misuse(f"{region} of {owner.facts.name} was freed while it was being mapped")
    with d._lock:
        d._allocs[region] = p
        d._peer_in[region] = owner
    return region


def unmap_peer(d: Device, region: Region) -> None:
    """End ``d``'s mapping of another device's ``region`` (``d.free`` of it)."""
    with d._lock:
        owner = d._peer_in.pop(region)
        p = d._allocs.pop(region)
    try:
        d.path.unmap_peer(p)
    except BaseException:
        with d._lock:  # still mapped: still d's, for stop to end
            d._peer_in[region] = owner
            d._allocs[region] = p
        raise
    with owner._lock:
        mappers = owner._peer_out.get(region)
        if mappers is not None:
            mappers.discard(d)
            if not mappers:
                del owner._peer_out[region]


def refuse_free(d: Device, region: Region) -> None:
    """:class:`Misuse` if another device maps ``region`` of ``d``."""
    with d._lock:
        mappers = d._peer_out.get(region)
        names = sorted(m.facts.name for m in mappers) if mappers else []
    if names:
        raise Misuse(f"{region} of {d.facts.name} is mapped into {', '.join(names)}: free "
                     "those mappings (their free of it) first")


def end_all(d: Device) -> BaseException | None:
    """At ``d``'s stop: end the mappings ``d`` holds of others' memory and those others hold
    of ``d``'s. Returns the first failure (the rest are still tried)."""
    failed: BaseException | None = None
    with d._lock:
        mine = list(d._peer_in)
        theirs = [(r, list(ms)) for r, ms in d._peer_out.items()]
    for region in mine:
        try:
            unmap_peer(d, region)
        except RigError as e:
            failed = failed or e
            with d._lock:  # the mapping is UVM's to end with the process; not d's memory
                d._peer_in.pop(region, None)
                d._allocs.pop(region, None)
    for region, mappers in theirs:
        for m in mappers:
            try:
                if region in m._peer_in:
                    unmap_peer(m, region)
            except RigError as e:
                failed = failed or e
    with d._lock:
        d._peer_out.clear()
    return failed
