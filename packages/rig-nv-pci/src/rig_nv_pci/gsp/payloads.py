"""The payloads of the RPCs CPU-RM sends a GSP and of their replies, as g_rpc-structures.h and
g_sdk-structures.h (open-gpu-kernel-modules 570.144) lay them out: GSP_RM_ALLOC,
GSP_RM_CONTROL, FREE, ALLOC_MEMORY, MAP_MEMORY_DMA and UNMAP_MEMORY_DMA,
UNLOADING_GUEST_DRIVER, and a root client's NV0000_ALLOC_PARAMETERS. The framing around them
is :mod:`rig_nv_pci.gsp.rpc`'s."""

from __future__ import annotations

import struct
from dataclasses import dataclass

ALLOC = struct.Struct("<7I4s")  # rpc_gsp_rm_alloc_v03_00 without params[]: 32 bytes
CONTROL = struct.Struct("<6I")  # rpc_gsp_rm_control_v03_00 without params[]: 24 bytes
FREE = struct.Struct("<4I")  # rpc_free_v03_00 = NVOS00_PARAMETERS_v03_00: 16 bytes
UNLOADING = struct.Struct("<??2xI")  # rpc_unloading_guest_driver_v1F_07: 8 bytes
ROOT_PARAMS = struct.Struct("<II100s4xQ")  # NV0000_ALLOC_PARAMETERS: 120 bytes
# rpc_alloc_memory_v13_01 up to pteDesc.pte_pde[]: hClient, hDevice, hMemory, hClass, flags
# (NVOS02), pteAdjust, format, length (u64 at 32), pageCount, then struct pte_desc's first
# u32 (idr 1:0, length 31:16) at 48; the page frame numbers (u64, address >> 12) from 56.
ALLOC_MEMORY = struct.Struct("<7I4xQI4xI4x")
# NVOS46_PARAMETERS_v03_00 (rpc_map_memory_dma_v03_00): hClient, hDevice, hDma, hMemory,
# offset, length, flags, dmaOffset (u64 at 40), status: 56 bytes.
MAP_DMA = struct.Struct("<4IQQI4xQI4x")
# NVOS47_PARAMETERS_v03_00 (rpc_unmap_memory_dma_v03_00): hClient, hDevice, hDma, hMemory,
# flags, dmaOffset (u64 at 24), status: 40 bytes.
UNMAP_DMA = struct.Struct("<5I4xQI4x")
RM_PAGE_SHIFT = 12  # _issuePteDescRpc: each pte_pde[] is a guest page's address >> 12

RMAPI_RPC_FLAGS_NONE = 0


def encode_alloc(h_client: int, h_parent: int, h_object: int, h_class: int,
                 params: bytes | bytearray = b"", flags: int = RMAPI_RPC_FLAGS_NONE) -> bytes:
    """The payload of GSP_RM_ALLOC (status 0, reserved 0, then the class's params)."""
    return ALLOC.pack(h_client, h_parent, h_object, h_class, 0, len(params), flags,
                      b"") + bytes(params)


@dataclass(frozen=True)
class AllocReply:
    h_client: int
    h_parent: int
    h_object: int
    h_class: int
    status: int
    flags: int
    params: bytes


def decode_alloc(payload: bytes) -> AllocReply:
    c, p, o, k, status, size, flags, _ = ALLOC.unpack_from(payload)
    return AllocReply(c, p, o, k, status, flags, payload[ALLOC.size:ALLOC.size + size])


def encode_control(h_client: int, h_object: int, cmd: int, params: bytes | bytearray = b"",
                   flags: int = RMAPI_RPC_FLAGS_NONE) -> bytes:
    """The payload of GSP_RM_CONTROL (status 0, then the command's params)."""
    return CONTROL.pack(h_client, h_object, cmd, 0, len(params), flags) + bytes(params)


@dataclass(frozen=True)
class ControlReply:
    h_client: int
    h_object: int
    cmd: int
    status: int
    flags: int
    params: bytes


def decode_control(payload: bytes) -> ControlReply:
    c, o, cmd, status, size, flags = CONTROL.unpack_from(payload)
    return ControlReply(c, o, cmd, status, flags, payload[CONTROL.size:CONTROL.size + size])


def encode_free(h_root: int, h_parent: int, h_object: int) -> bytes:
    """The payload of FREE: NVOS00 with hObjectParent 0 as nouveau sends it."""
    return FREE.pack(h_root, h_parent, h_object, 0)


def decode_free(payload: bytes) -> int:
    """The status of a FREE reply."""
    return int(FREE.unpack_from(payload)[3])


def encode_alloc_memory(h_client: int, h_device: int, h_memory: int, h_class: int, flags: int,
                        length: int, pages: list[int], format: int = 0) -> bytes:
    """The payload of ALLOC_MEMORY (rpcAllocMemory_v13_01 as a GSP client sends it: the
    memory's page addresses, one pte_desc entry each, IDR 0, pteAdjust 0; ``format`` the PTE
    kind, memdescGetPteKind)."""
    return ALLOC_MEMORY.pack(h_client, h_device, h_memory, h_class, flags, 0, format, length,
                             len(pages), (len(pages) & 0xFFFF) << 16) + struct.pack(
        f"<{len(pages)}Q", *(p >> RM_PAGE_SHIFT for p in pages))


def encode_map_dma(h_client: int, h_device: int, h_dma: int, h_memory: int, offset: int,
                   length: int, flags: int, dma_offset: int) -> bytes:
    """The payload of MAP_MEMORY_DMA (rpcMapMemoryDma_v03_00)."""
    return MAP_DMA.pack(h_client, h_device, h_dma, h_memory, offset, length, flags,
                        dma_offset, 0)


def decode_map_dma(payload: bytes) -> tuple[int, int]:
    """The dmaOffset and status of a MAP_MEMORY_DMA reply."""
    fields = MAP_DMA.unpack_from(payload)
    return int(fields[7]), int(fields[8])


def encode_unmap_dma(h_client: int, h_device: int, h_dma: int, h_memory: int, flags: int,
                     dma_offset: int) -> bytes:
    """The payload of UNMAP_MEMORY_DMA (rpcUnmapMemoryDma_v03_00)."""
    return UNMAP_DMA.pack(h_client, h_device, h_dma, h_memory, flags, dma_offset, 0)


def decode_unmap_dma(payload: bytes) -> int:
    """The status of an UNMAP_MEMORY_DMA reply."""
    return int(UNMAP_DMA.unpack_from(payload)[6])


def encode_unloading(in_pm_transition: bool = False, gc6_entering: bool = False,
                     new_level: int = 0) -> bytes:
    """The payload of UNLOADING_GUEST_DRIVER (a plain unload: no power transition)."""
    return UNLOADING.pack(in_pm_transition, gc6_entering, new_level)


def root_params(h_client: int) -> bytearray:
    """NV0000_ALLOC_PARAMETERS for a client: processID ~0, as nouveau gives it."""
    return bytearray(ROOT_PARAMS.pack(h_client, 0xFFFFFFFF, b"rig", 0))
