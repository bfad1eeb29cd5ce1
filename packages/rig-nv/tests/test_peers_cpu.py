"""Peer mappings' bookkeeping (rig_nv/peers.py) on two stand-in devices: what map_peer,
free and stop promise about the order of frees and stops (issue 10), checked without a GPU.
The stand-ins share the host's memory, so a peer region reads what its owner wrote."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fake_gpu import BASE, FakePath, open_fake, open_on

from rig_edge import Memory, Misuse, RigError


@pytest.fixture
def two() -> Iterator[tuple[Any, FakePath, Any, FakePath]]:

    d0, p0 = open_fake()
    p1 = FakePath()
    p1.next = BASE + (128 << 30)  # the second stand-in's memory lies apart from the first's
    d1 = open_on(p1)
    try:
        yield d0, p0, d1, p1
    finally:
        d1.stop()
        d0.stop()


def test_map_peer_region_serves_the_mappers_copies(two: Any) -> None:
    d0, _, d1, p1 = two
    r0 = d0.alloc(8192, Memory.PINNED)
    data = os.urandom(8192)
    d0.upload(r0, data)
    p = d1.map_peer(d0, r0)
    assert p == r0 and p1.peer_maps == [r0.gpu]
    assert bytes(d1.download(p)) == data  # the mapper's own download reaches it
    d1.free(p)
    assert p1.peer_maps == []
    d0.free(r0)


def test_owner_free_refused_while_mapped_then_allowed(two: Any) -> None:
    d0, _, d1, _ = two
    r0 = d0.alloc(4096, Memory.DEVICE)
    p = d1.map_peer(d0, r0)
    with pytest.raises(Misuse, match=r"mapped into NV: free those mappings"):
        d0.free(r0)
    assert r0 in d0.memory.regions()  # the refused free changed nothing
    d1.free(p)
    d0.free(r0)
    assert r0 not in d0.memory.regions() and not d0.memory.peers_out()


@pytest.mark.parametrize("case", ["self", "not-a-device", "freed", "part", "twice", "mapped"])
def test_map_peer_misuse(two: Any, case: str) -> None:
    d0, _, d1, p1 = two
    r0 = d0.alloc(8192, Memory.DEVICE)
    before = list(p1.peer_maps)
    if case == "self":
        call, match = (lambda: d0.map_peer(d0, r0)), "own"
    elif case == "not-a-device":
        call, match = (lambda: d1.map_peer(object(), r0)), "must be a rig_nv.Device"
    elif case == "freed":
        d0.free(r0)
        call, match = (lambda: d1.map_peer(d0, r0)), "no region"
    elif case == "part":
        from rig_edge import Region

        part = Region(r0.gpu + 4096, None, 4096, Memory.DEVICE)
        call, match = (lambda: d1.map_peer(d0, part)), "whole region"
    elif case == "twice":
        d1.map_peer(d0, r0)
        before = list(p1.peer_maps)
        call, match = (lambda: d1.map_peer(d0, r0)), "already"
    else:  # a region d0 itself maps from d1 is d1's, not d0's to lend on
        r1 = d1.alloc(4096, Memory.DEVICE)
        d0.map_peer(d1, r1)
        call, match = (lambda: d1.map_peer(d0, r1)), "of the device that made it"
    with pytest.raises(Misuse, match=match):
        call()
    assert p1.peer_maps == before


def test_stop_of_the_owner_ends_the_mapping(two: Any) -> None:
    d0, _, d1, p1 = two
    r0 = d0.alloc(4096, Memory.DEVICE)
    p = d1.map_peer(d0, r0)
    d0.stop()
    assert p1.peer_maps == [] and p not in d1.memory.regions() and not d1.memory.peers_in()
    local = d1.alloc(4096, Memory.DEVICE)
    with pytest.raises(Misuse, match="not a live region"):
        d1.copy(local, p)


def test_stop_of_the_mapper_ends_its_mappings_not_the_owners_memory(two: Any) -> None:
    d0, _, d1, p1 = two
    r0 = d0.alloc(4096, Memory.PINNED)
    d1.map_peer(d0, r0)
    d1.stop()
    assert p1.peer_maps == [] and not d0.memory.peers_out()
    d0.free(r0)  # no longer mapped anywhere: the owner frees it


def test_copy_engine_choice(two: Any) -> None:
    d0, _, _, _ = two
    a, b = d0.alloc(4096, Memory.DEVICE), d0.alloc(4096, Memory.PINNED)
    with pytest.raises(Misuse, match="'auto', 'copy' or 'sm', not 'dma'"):
        d0.copy(a, b, engine="dma")
    with pytest.raises(Misuse, match=r"GPU memory .* only, not pinned to device"):
        d0.copy(a, b, engine="sm")
    d0.copy(a, b, engine="copy")


def test_a_failed_peer_unmap_at_stop_still_gives_back_the_memory(
        two: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """stop tries every step whatever failed before it: a peer mapping UVM refuses to end
    raises at the end, after the device's own memory and regions went back to the path."""
    d0, _, d1, p1 = two
    r0 = d0.alloc(4096, Memory.DEVICE)
    mine = d1.alloc(4096, Memory.PINNED)
    assert mine is not None
    d1.map_peer(d0, r0)
    memory = {id(a) for a in [*d1.memory.owned(), d1.memory.regions()[mine]]}
    freed: list[int] = []
    refusal = RigError("the NVIDIA UVM driver refused UVM_UNMAP_EXTERNAL (EIO)")

    def refuse(p: Any) -> None:
        raise refusal

    monkeypatch.setattr(p1, "unmap_peer", refuse)
    monkeypatch.setattr(p1, "free_memory", lambda a: freed.append(id(a)))
    with pytest.raises(RigError) as e:
        d1.stop()
    assert e.value is refusal
    assert memory <= set(freed), "stop() kept memory after a peer's unmap failed"
