"""Channel errors as NVIDIA names them (robust-channel errors, the Xid numbers of the kernel log).

Numbers and names from open-gpu-kernel-modules src/common/sdk/nvidia/inc/nverror.h @580.142
(ROBUST_CHANNEL_*). The RM writes the number into a channel's error notifier (NvNotification
index 0 of the memory given as hObjectError: info32 = the number, info16 = the engine type,
status = 0xFFFF), per nvgputypes.h and kernel_rc_notification.c.
"""

from __future__ import annotations

XID: dict[int, str] = {
    13: "ROBUST_CHANNEL_GR_EXCEPTION",
    14: "ROBUST_CHANNEL_FAKE_ERROR",
    31: "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
    32: "ROBUST_CHANNEL_PBDMA_ERROR",
    39: "ROBUST_CHANNEL_CE0_ERROR",
    40: "ROBUST_CHANNEL_CE1_ERROR",
    41: "ROBUST_CHANNEL_CE2_ERROR",
    43: "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
    44: "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
    45: "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
    48: "ROBUST_CHANNEL_GPU_ECC_DBE",
    62: "PMU_HALT_ERROR",
    68: "ROBUST_CHANNEL_NVDEC0_ERROR",
    69: "ROBUST_CHANNEL_GR_CLASS_ERROR",
    70: "ROBUST_CHANNEL_CE3_ERROR",
    71: "ROBUST_CHANNEL_CE4_ERROR",
    72: "ROBUST_CHANNEL_CE5_ERROR",
    75: "ROBUST_CHANNEL_CE6_ERROR",
    76: "ROBUST_CHANNEL_CE7_ERROR",
    77: "ROBUST_CHANNEL_CE8_ERROR",
    79: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
    85: "ROBUST_CHANNEL_CE9_ERROR",
    94: "ROBUST_CHANNEL_CONTAINED_ERROR",
    95: "ROBUST_CHANNEL_UNCONTAINED_ERROR",
    119: "GSP_RPC_TIMEOUT",
    120: "GSP_ERROR",
}

# NV2080_ENGINE_TYPE_* (cl2080_notification.h): the engine in a notifier's info16.
ENGINE = {1: "graphics/compute", **{0x09 + i: f"copy engine {i}" for i in range(10)}}


def xid_name(number: int) -> str:
    """NVIDIA's name of a channel error, and its number: "ROBUST_CHANNEL_GR_EXCEPTION (Xid 13)"."""
    return f"{XID.get(number, 'ROBUST_CHANNEL_ERROR')} (Xid {number})"
