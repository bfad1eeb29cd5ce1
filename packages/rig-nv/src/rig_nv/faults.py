"""Channel errors as NVIDIA names them (robust-channel errors, the Xid numbers of the kernel log).

Numbers and names from open-gpu-kernel-modules src/common/sdk/nvidia/inc/nverror.h @580.142
(ROBUST_CHANNEL_*). The RM writes the number into a channel's error notifier (NvNotification
index 0 of the memory given as hObjectError: info32 = the number, info16 = the engine type,
status = 0xFFFF), per nvgputypes.h and kernel_rc_notification.c.
"""

from __future__ import annotations

XID: dict[int, str] = {
    13: "GR_EXCEPTION",
    14: "FAKE_ERROR",
    31: "FIFO_ERROR_MMU_ERR_FLT",
    32: "PBDMA_ERROR",
    39: "CE0_ERROR",
    40: "CE1_ERROR",
    41: "CE2_ERROR",
    43: "RESETCHANNEL_VERIF_ERROR",
    44: "GR_FAULT_DURING_CTXSW",
    45: "PREEMPTIVE_REMOVAL",
    48: "GPU_ECC_DBE",
    62: "PMU_HALT_ERROR",
    68: "NVDEC0_ERROR",
    69: "GR_CLASS_ERROR",
    70: "CE3_ERROR",
    71: "CE4_ERROR",
    72: "CE5_ERROR",
    75: "CE6_ERROR",
    76: "CE7_ERROR",
    77: "CE8_ERROR",
    79: "GPU_HAS_FALLEN_OFF_THE_BUS",
    85: "CE9_ERROR",
    94: "CONTAINED_ERROR",
    95: "UNCONTAINED_ERROR",
    109: "CTXSW_TIMEOUT",
    119: "GSP_RPC_TIMEOUT",
    120: "GSP_ERROR",
}

# NV2080_ENGINE_TYPE_* (cl2080_notification.h): the engine in a notifier's info16.
ENGINE = {1: "graphics/compute", **{0x09 + i: f"copy engine {i}" for i in range(10)}}


def xid_name(number: int) -> str:
    """``"ROBUST_CHANNEL_GR_EXCEPTION (Xid 13)"`` for a channel error number."""
    return f"ROBUST_CHANNEL_{XID.get(number, 'ERROR')} (Xid {number})"
