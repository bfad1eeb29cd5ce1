"""The RPC channel of rig_nv_pci.gsp.rpc against the GSP peer (sim/gsp_peer.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim import peer_module

from rig_nv_pci.gsp import queue as q
from rig_nv_pci.gsp import rpc as r


def connect(layout: q.Layout | None = None, *, events: list[r.Incoming] | None = None,
            timeout_s: float = 5.0, sleep: Callable[[float], None] | None = None,
            **peer_kw: Any) -> tuple[r.Rpc, Any]:
    """An Rpc over fresh queues whose GSP end is a booted Peer (``peer_kw`` its fields); its
    waits serve the peer unless ``sleep`` is given (Rpc's own parameter)."""
    layout = layout or q.Layout()
    shared = memoryview(bytearray(layout.size))
    peer = peer_module().Peer(shared, layout.command_offset, layout.status_offset,
                              layout.status_size, **peer_kw)
    queues = q.QueuePair(shared, layout, doorbell=peer.doorbell, name="GPU 0")
    queues.create()
    peer.boot()
    rpc = r.Rpc(queues, on_event=None if events is None else events.append,
                sleep=sleep or (lambda _left: peer.service()), timeout_s=timeout_s)
    return rpc, peer

