"""Memory kinds, regions and DMA descriptions."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Memory(enum.Enum):
    """Where a region's memory lies.

    ``DEVICE``: the GPU's own memory, not seen by the host.
    ``PINNED``: host memory the GPU reads and writes, at the same address for both.
    ``MAPPED``: GPU memory the host sees through BAR1, at the same address for both.
    """

    DEVICE = "device"
    PINNED = "pinned"
    MAPPED = "mapped"


class Refusal(enum.Enum):
    """Why ``map_host`` mapped nothing, told apart without parsing text.

    ``NEVER``: these pages can never be mapped (unmapped, or the kernel refuses to pin them,
    as Linux >= 6.5 does for shared file mappings on file systems that track dirty pages).
    ``NO_ROOM``: the driver lacks its own memory, GPU addresses or files right now.
    """

    NEVER = "never"
    NO_ROOM = "no room"


@dataclass(frozen=True)
class Region:
    """A run of memory the GPU addresses.

    ``gpu`` is its GPU virtual address; ``host`` its host address where the host sees it
    (Pinned, Mapped and host-mapped memory) or ``None``; ``length`` in bytes.
    """

    gpu: int
    host: int | None
    length: int
    kind: Memory

    def __post_init__(self) -> None:
        if self.length <= 0:
            raise ValueError(f"a region's length must be positive, not {self.length}")

    def __hash__(self) -> int:
        # Equal regions have equal GPU addresses; hashing all four fields (the Memory enum's
        # hash is Python code) cost a third of an allocation's time in a device's dicts.
        return hash(self.gpu)


@dataclass(frozen=True)
class Dmabuf:
    """A dma-buf: a file descriptor, and the offset and length of the memory in it."""

    fd: int
    offset: int
    length: int


@dataclass(frozen=True)
class Bus:
    """Bus addresses another device may reach memory at, or why it can't.

    ``ranges`` is a tuple of (bus address, length), in the memory's order, together covering
    it; ``reason`` says why there are none. A device's ``dma`` gives one of these where its
    path hands out bus addresses (rig_nv_pci) and a :class:`Dmabuf` where it exports a dma-buf
    (rig_nv_nvidia).
    """

    ranges: tuple[tuple[int, int], ...] = ()
    reason: str | None = None
