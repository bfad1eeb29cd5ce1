"""Memory kinds, regions and DMA descriptions."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from rig_edge import hostview


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

    A region the host sees is CPU memory to Python: :meth:`view` (and, on Python 3.12+,
    ``memoryview(region)``), ``numpy.asarray(region)`` and ``numpy.from_dlpack(region)`` (or
    torch's, jax's) read and write it in place as 1-D ``uint8``, valid until it is freed.
    ``gpu`` is an address in rig's own GPU address space, not CUDA's: no view names the GPU.
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

    def view(self) -> memoryview:
        """A writable 1-D memoryview of bytes over the region's host memory, no copy.

        Raises :class:`rig_edge.Misuse` for a region the host does not see (Device memory).
        """
        return hostview.view(self)

    def __buffer__(self, flags: int, /) -> memoryview:
        """The buffer protocol on Python 3.12+ (PEP 688): ``memoryview(region)``."""
        return hostview.view(self)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface: ``numpy.asarray(region)`` is 1-D ``uint8``, no copy.

        Raises :class:`rig_edge.Misuse` for a region the host does not see.
        """
        return hostview.array_interface(self)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None,
                   copy: bool | None = None) -> object:
        """A DLPack capsule of the region as a 1-D ``uint8`` CPU tensor, no copy.

        Raises :class:`rig_edge.Misuse` for a region the host does not see and
        :class:`BufferError` for a device other than the CPU or ``copy=True``.
        """
        if dl_device is not None and tuple(dl_device) != (hostview.KDL_CPU, 0):
            raise BufferError(f"a rig region is CPU memory (DLPack device (1, 0)), "
                              f"not device {dl_device}")
        if copy:
            raise BufferError("a rig region's DLPack export never copies")
        return hostview.dlpack(self, versioned=max_version is not None and max_version[0] >= 1)

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack's device of a host-visible region: the CPU, ``(1, 0)`` (kDLCPU)."""
        hostview.host_of(self)
        return (hostview.KDL_CPU, 0)


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
