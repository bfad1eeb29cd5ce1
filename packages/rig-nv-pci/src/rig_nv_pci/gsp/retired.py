"""The GPU's retired video-memory pages, asked of GSP-RM as a GSP client's CPU-RM asks them.

How NVIDIA's CPU-RM learns them (open-gpu-kernel-modules 570.144; 595.45.04 the same).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-retired.md."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rig_edge import RigError
from rig_nv.status import status_name
from rig_nv_pci.gsp import payloads, rpc
from rig_nv_pci.gsp.static_info import StaticInfo

NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES = 0x20801348  # ctrl2080fb.h
MAX_ENTRIES = 64  # NV2080_CTRL_FB_DYNAMIC_BLACKLIST_MAX_ENTRIES: entries a pass holds
MAX_PAGES = 512  # NV2080_CTRL_FB_DYNAMIC_BLACKLIST_MAX_PAGES
RM_PAGE_SHIFT = 12  # a pageNumber is an FB address >> 12 (memmgrGetBlackListPages_GA100)
# NV2080_CTRL_FB_DYNAMIC_OFFLINED_ADDRESS_INFO: NvU64 pageNumber; NvU8 source; 7 bytes pad
ENTRY = struct.Struct("<QB7x")
# NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS after offlined[64]: validEntries,
# baseIndex, bMore, padded to the struct's 8-byte alignment
TAIL = struct.Struct("<IIB7x")
OFFLINED = 0  # offlined[] at the struct's start
VALID_ENTRIES = MAX_ENTRIES * ENTRY.size  # 1024
SIZE = VALID_ENTRIES + TAIL.size  # 1040
# nvstatuscodes.h: the refusals CPU-RM reads as "No blacklisted pages"
NV_ERR_NOT_SUPPORTED, NV_ERR_OBJECT_NOT_FOUND = 0x56, 0x57


class RetiredPagesError(RigError):
    """GSP-RM refused to list the retired pages, or listed them in an answer that cannot be
    NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS."""


@dataclass(frozen=True)
class RetiredPage:
    """A retired page: its FB address (4 KiB aligned) and why it was retired (``source``,
    NV2080_CTRL_FB_DYNAMIC_BLACKLISTED_PAGES_SOURCE_*)."""

    address: int
    source: int


def params(base_index: int) -> bytes:
    """A pass's params, as memmgrGetBlackListPages_GA100 zeroes them and sets baseIndex."""
    out = bytearray(SIZE)
    TAIL.pack_into(out, VALID_ENTRIES, 0, base_index, 0)
    return bytes(out)


def decode(answer: bytes) -> tuple[list[RetiredPage], bool]:
    """The pages of one pass's answer and its bMore; :class:`RetiredPagesError` (without the
    GPU's name) for an answer that cannot be the struct."""
    if len(answer) != SIZE:
        raise RetiredPagesError(f"answered {len(answer)} bytes, not the {SIZE} of "
                                "NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS")
    valid, _, more = TAIL.unpack_from(answer, VALID_ENTRIES)
    if valid > MAX_ENTRIES:
        raise RetiredPagesError(f"is garbled: {valid} valid entries in a pass of at most "
                                f"{MAX_ENTRIES}")
    if more > 1:
        raise RetiredPagesError(f"is garbled: bMore {more}")
    pages = []
    for i in range(valid):
        number, source = ENTRY.unpack_from(answer, OFFLINED + i * ENTRY.size)
        pages.append(RetiredPage((number << RM_PAGE_SHIFT) & (1 << 64) - 1, source))
    return pages, bool(more)


def get_retired(channel: rpc.Rpc, static: StaticInfo,
                timeout_s: float | None = None) -> tuple[RetiredPage, ...]:
    """The retired pages GSP-RM lists, asked of its internal subdevice pass by pass as
    memmgrGetBlackListPages_GA100 asks (none asked where the static info says GSP-RM retires
    no pages); see the module's docstring for what ends the list and what is an error."""
    if not static.page_retirement:
        return ()
    what = (f"{channel.name}: NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES (the GPU's retired "
            "pages)")
    pages: list[RetiredPage] = []
    base = 0
    while base < MAX_PAGES:
        reply = channel.call(rpc.Function.GSP_RM_CONTROL, payloads.encode_control(
            static.internal_client, static.internal_subdevice,
            NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES, params(base)),
            check=False, timeout_s=timeout_s)
        answer = (payloads.decode_control(reply.payload)
                  if len(reply.payload) >= payloads.CONTROL.size else None)
        # the params' own status where GSP-RM set one, else the RPC's (rpcRmApiControl_GSP)
        if answer is not None and answer.status:
            status, text = answer.status, status_name(answer.status)
        else:
            status, text = rpc.result_status(reply.result), rpc.result_text(reply.result)
        if status in (NV_ERR_NOT_SUPPORTED, NV_ERR_OBJECT_NOT_FOUND) and base == 0:
            return ()  # "No blacklisted pages" (memmgrGetBlackListPages_GA100)
        if status:
            after = f" at baseIndex {base}, after a pass said there were more" if base else ""
            raise RetiredPagesError(f"{what} was refused{after}: {text}")
        if answer is None:
            raise RetiredPagesError(f"{what}: a reply too short to hold its status")
        try:
            got, more = decode(answer.params)
        except RetiredPagesError as e:
            raise RetiredPagesError(f"{what} {e}") from e
        pages += got
        if not more:
            return tuple(pages)
        base += MAX_ENTRIES
    raise RetiredPagesError(f"{what} is garbled: more than {MAX_PAGES} pages "
                            "(NV2080_CTRL_FB_DYNAMIC_BLACKLIST_MAX_PAGES)")
