"""The kernel driver's ioctl structs (rig_nv_nvidia.layouts) against NVIDIA's headers.

Every number comes from open-gpu-kernel-modules at tags 570.211.01 and 580.142, compiled with gcc
for x86-64 and read with gdb's ``ptype /o`` (nvos.h, nv_escape.h, uvm_ioctl.h).
The kernel checks each escape's size exactly (escape.c), and UVM copies its own struct's size in
and out whatever the caller passed (uvm.c), so a wrong size or offset is a wrong call.
"""

from __future__ import annotations

import pytest

from rig_nv_nvidia import layouts as lay
from rig_nv_nvidia.layouts import ioctl_ffi, nv_request

RELEASES = ("570", "580")

# struct -> (size, {field: offset}); the same in 570.211.01 and 580.142 (but bAllowMmap, below).
STRUCTS: dict[str, tuple[int, dict[str, int]]] = {
    # kernel-open/common/inc/nv-ioctl.h @570.211.01, @580.142
    "nv_pci_info_t": (12, {
        "domain": 0, "bus": 4, "slot": 5, "function": 6, "vendor_id": 8, "device_id": 10,
    }),
    # kernel-open/common/inc/nv-ioctl.h @570.211.01, @580.142
    "nv_ioctl_card_info_t": (72, {
        "valid": 0, "pci_info": 4, "gpu_id": 16, "interrupt_line": 20, "reg_address": 24,
        "reg_size": 32, "fb_address": 40, "fb_size": 48, "minor_number": 56, "dev_name": 60,
    }),
    # kernel-open/common/inc/nv-ioctl.h @570.211.01, @580.142
    "nv_ioctl_register_fd_t": (4, {"ctl_fd": 0}),
    # kernel-open/common/inc/nv-ioctl.h @570.211.01, @580.142
    "nv_ioctl_rm_api_version_t": (72, {"cmd": 0, "reply": 4, "versionString": 8}),
    # kernel-open/common/inc/nv-ioctl.h @580.142 (@570.211.01: byte 33, bAllowMmap, is padding)
    "nv_ioctl_export_to_dma_buf_fd_t": (2608, {
        "fd": 0, "hClient": 4, "totalObjects": 8, "numObjects": 12, "index": 16, "totalSize": 24,
        "mappingType": 32, "bAllowMmap": 33, "handles": 36, "offsets": 552, "sizes": 1576,
        "status": 2600,
    }),
    # src/common/sdk/nvidia/inc/nvos.h @570.211.01, @580.142
    "NVOS21_PARAMETERS": (32, {
        "hRoot": 0, "hObjectParent": 4, "hObjectNew": 8, "hClass": 12, "pAllocParms": 16,
        "paramsSize": 24, "status": 28,
    }),
    # src/common/sdk/nvidia/inc/nvos.h @570.211.01, @580.142
    "NVOS54_PARAMETERS": (32, {
        "hClient": 0, "hObject": 4, "cmd": 8, "flags": 12, "params": 16, "paramsSize": 24,
        "status": 28,
    }),
    # src/common/sdk/nvidia/inc/nvos.h @570.211.01, @580.142
    "NVOS00_PARAMETERS": (16, {"hRoot": 0, "hObjectParent": 4, "hObjectOld": 8, "status": 12}),
    # src/common/sdk/nvidia/inc/nvos.h @570.211.01, @580.142
    "NVOS02_PARAMETERS": (48, {
        "hRoot": 0, "hObjectParent": 4, "hObjectNew": 8, "hClass": 12, "flags": 16,
        "pMemory": 24, "limit": 32, "status": 40,
    }),
    # src/nvidia/arch/nvalloc/unix/include/nv-unix-nvos-params-wrappers.h @570.211.01, @580.142
    "nv_ioctl_nvos02_parameters_with_fd": (56, {"params": 0, "fd": 48}),
    # src/common/sdk/nvidia/inc/nvos.h @570.211.01, @580.142
    "NVOS33_PARAMETERS": (48, {
        "hClient": 0, "hDevice": 4, "hMemory": 8, "offset": 16, "length": 24,
        "pLinearAddress": 32, "status": 40, "flags": 44,
    }),
    # src/nvidia/arch/nvalloc/unix/include/nv-unix-nvos-params-wrappers.h @570.211.01, @580.142
    "nv_ioctl_nvos33_parameters_with_fd": (56, {"params": 0, "fd": 48}),
    # src/common/sdk/nvidia/inc/nvos.h @570.211.01, @580.142
    "NVOS34_PARAMETERS": (32, {
        "hClient": 0, "hDevice": 4, "hMemory": 8, "pLinearAddress": 16, "status": 24, "flags": 28,
    }),
    # kernel-open/common/inc/nvCpuUuid.h @570.211.01, @580.142
    "NvProcessorUuid": (16, {"uuid": 0}),
    # kernel-open/nvidia-uvm/uvm_linux_ioctl.h @570.211.01, @580.142
    "UVM_INITIALIZE_PARAMS": (16, {"flags": 0, "rmStatus": 8}),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_MM_INITIALIZE_PARAMS": (8, {"uvmFd": 0, "rmStatus": 4}),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_REGISTER_GPU_PARAMS": (40, {
        "gpu_uuid": 0, "numaEnabled": 16, "numaNodeId": 20, "rmCtrlFd": 24, "hClient": 28,
        "hSmcPartRef": 32, "rmStatus": 36,
    }),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_UNREGISTER_GPU_PARAMS": (20, {"gpu_uuid": 0, "rmStatus": 16}),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_REGISTER_GPU_VASPACE_PARAMS": (32, {
        "gpuUuid": 0, "rmCtrlFd": 16, "hClient": 20, "hVaSpace": 24, "rmStatus": 28,
    }),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_UNREGISTER_GPU_VASPACE_PARAMS": (20, {"gpuUuid": 0, "rmStatus": 16}),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_REGISTER_CHANNEL_PARAMS": (56, {
        "gpuUuid": 0, "rmCtrlFd": 16, "hClient": 20, "hChannel": 24, "base": 32, "length": 40,
        "rmStatus": 48,
    }),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142 (595.45.04 drops gpuUuid: 12)
    "UVM_UNREGISTER_CHANNEL_PARAMS": (28, {
        "gpuUuid": 0, "hClient": 16, "hChannel": 20, "rmStatus": 24,
    }),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_CREATE_EXTERNAL_RANGE_PARAMS": (24, {"base": 0, "length": 8, "rmStatus": 16}),
    # kernel-open/nvidia-uvm/uvm_types.h @570.211.01, @580.142
    "UvmGpuMappingAttributes": (36, {
        "gpuUuid": 0, "gpuMappingType": 16, "gpuCachingType": 20, "gpuFormatType": 24,
        "gpuElementBits": 28, "gpuCompressionType": 32,
    }),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142
    "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS": (9264, {
        "base": 0, "length": 8, "offset": 16, "perGpuAttributes": 24,
        "gpuAttributesCount": 9240, "rmCtrlFd": 9248, "hClient": 9252, "hMemory": 9256,
        "rmStatus": 9260,
    }),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142 (595.45.04 drops length: 16)
    "UVM_FREE_PARAMS": (24, {"base": 0, "length": 8, "rmStatus": 16}),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142 (UVM_IOCTL_BASE(29))
    "UVM_ENABLE_PEER_ACCESS_PARAMS": (36, {"gpuUuidA": 0, "gpuUuidB": 16, "rmStatus": 32}),
    # kernel-open/nvidia-uvm/uvm_ioctl.h @570.211.01, @580.142 (UVM_IOCTL_BASE(66))
    "UVM_UNMAP_EXTERNAL_PARAMS": (40, {"base": 0, "length": 8, "gpuUuid": 16, "rmStatus": 32}),
}

CASES = [(key, name, size, fields) for key in RELEASES for name, (size, fields) in STRUCTS.items()]


@pytest.mark.parametrize(("key", "name", "size", "fields"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_struct_size_and_offsets(key: str, name: str, size: int, fields: dict[str, int]) -> None:
    ffi = ioctl_ffi(key)
    assert ffi.sizeof(name) == size
    for field, offset in fields.items():
        assert ffi.offsetof(name, field) == offset, f"{name}.{field}"


@pytest.mark.parametrize("key", RELEASES)
def test_every_declared_struct_and_field_is_checked(key: str) -> None:
    """A struct or field added to rig_nv_nvidia.layouts without numbers here fails this test."""
    ffi = ioctl_ffi(key)
    declared = {n for n in ffi.list_types()[0] if ffi.typeof(n).kind == "struct"}
    assert declared == set(STRUCTS)
    for name, (_, fields) in STRUCTS.items():
        assert [f for f, _ in ffi.typeof(name).fields] == list(fields), name


@pytest.mark.parametrize("key", RELEASES)
def test_arrays_and_nested_fields(key: str) -> None:
    ffi = ioctl_ffi(key)
    ex = "nv_ioctl_export_to_dma_buf_fd_t"
    # NV_DMABUF_EXPORT_MAX_HANDLES = 128 handles, offsets and sizes.
    assert ffi.offsetof(ex, "handles", 127) == 36 + 127 * 4
    assert ffi.offsetof(ex, "offsets", 127) == 552 + 127 * 8
    assert ffi.offsetof(ex, "sizes", 127) == 1576 + 127 * 8
    card = "nv_ioctl_card_info_t"
    assert ffi.offsetof(card, "pci_info", "bus") == 8
    assert ffi.offsetof(card, "pci_info", "slot") == 9
    assert ffi.offsetof(card, "dev_name", 9) == 69
    assert ffi.sizeof("nv_ioctl_card_info_t[32]") == 72 * 32
    m = "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS"
    # UVM_MAX_GPUS = 256 attributes of 36 bytes from 24.
    assert ffi.offsetof(m, "perGpuAttributes", 255, "gpuCompressionType") == 24 + 255 * 36 + 32
    assert ffi.offsetof(m, "perGpuAttributes", 1, "gpuMappingType") == 24 + 36 + 16
    assert ffi.offsetof("nv_ioctl_nvos33_parameters_with_fd", "params", "pLinearAddress") == 32
    assert ffi.offsetof("nv_ioctl_nvos02_parameters_with_fd", "params", "status") == 40
    assert ffi.offsetof("UVM_REGISTER_GPU_PARAMS", "gpu_uuid", "uuid", 15) == 15


# -- request numbers -------------------------------------------------------------------------


@pytest.mark.parametrize(("nr", "size", "number"), [
    (0x2B, 32, 0xC020462B),    # NV_ESC_RM_ALLOC, NVOS21
    (0x4E, 56, 0xC038464E),    # NV_ESC_RM_MAP_MEMORY, nvos33 with fd
    (217, 2608, 0xCA3046D9),   # NV_ESC_EXPORT_TO_DMABUF_FD
    (0x27, 56, 0xC0384627),    # NV_ESC_RM_ALLOC_MEMORY, nvos02 with fd
    (0x29, 16, 0xC0104629),    # NV_ESC_RM_FREE, NVOS00
    (0x2A, 32, 0xC020462A),    # NV_ESC_RM_CONTROL, NVOS54
    (0x4F, 32, 0xC020464F),    # NV_ESC_RM_UNMAP_MEMORY, NVOS34
    (200, 72 * 32, 0xC90046C8),  # NV_ESC_CARD_INFO with 32 cards
    (201, 4, 0xC00446C9),      # NV_ESC_REGISTER_FD
    (210, 72, 0xC04846D2),     # NV_ESC_CHECK_VERSION_STR
])
def test_nv_request(nr: int, size: int, number: int) -> None:
    """_IOWR('F', nr, size), per rm_structs.md section 1.2."""
    assert nv_request(nr, size) == number


@pytest.mark.parametrize("key", RELEASES)
def test_requests_rig_sends(key: str) -> None:
    """Each escape rig sends carries its own struct's size, as the kernel checks exactly."""
    ffi = ioctl_ffi(key)
    sent = {
        lay.NV_ESC_RM_ALLOC: ("NVOS21_PARAMETERS", 0xC020462B),
        lay.NV_ESC_RM_CONTROL: ("NVOS54_PARAMETERS", 0xC020462A),
        lay.NV_ESC_RM_FREE: ("NVOS00_PARAMETERS", 0xC0104629),
        lay.NV_ESC_RM_ALLOC_MEMORY: ("nv_ioctl_nvos02_parameters_with_fd", 0xC0384627),
        lay.NV_ESC_RM_MAP_MEMORY: ("nv_ioctl_nvos33_parameters_with_fd", 0xC038464E),
        lay.NV_ESC_RM_UNMAP_MEMORY: ("NVOS34_PARAMETERS", 0xC020464F),
        lay.NV_ESC_REGISTER_FD: ("nv_ioctl_register_fd_t", 0xC00446C9),
        lay.NV_ESC_CHECK_VERSION_STR: ("nv_ioctl_rm_api_version_t", 0xC04846D2),
        lay.NV_ESC_EXPORT_TO_DMABUF_FD: ("nv_ioctl_export_to_dma_buf_fd_t", 0xCA3046D9),
    }
    for nr, (struct, request) in sent.items():
        assert nv_request(nr, ffi.sizeof(struct)) == request, struct
    cards = ffi.sizeof(f"nv_ioctl_card_info_t[{lay.MAX_CARDS}]")
    assert nv_request(lay.NV_ESC_CARD_INFO, cards) == 0xC90046C8
    # The size field of the request is 14 bits: every struct here fits it.
    assert all(ffi.sizeof(s) < 1 << 14 for s, _ in sent.values())


def test_escape_and_uvm_numbers() -> None:
    """nv-ioctl-numbers.h, nv_escape.h, uvm_ioctl.h and uvm_linux_ioctl.h (570 = 580)."""
    assert (lay.NV_ESC_RM_ALLOC_MEMORY, lay.NV_ESC_RM_FREE, lay.NV_ESC_RM_CONTROL,
            lay.NV_ESC_RM_ALLOC, lay.NV_ESC_RM_MAP_MEMORY, lay.NV_ESC_RM_UNMAP_MEMORY) == (
            0x27, 0x29, 0x2A, 0x2B, 0x4E, 0x4F)
    assert (lay.NV_ESC_CARD_INFO, lay.NV_ESC_REGISTER_FD, lay.NV_ESC_CHECK_VERSION_STR,
            lay.NV_ESC_EXPORT_TO_DMABUF_FD) == (200, 201, 210, 217)
    assert lay.UVM_INITIALIZE == 0x30000001
    assert (lay.UVM_REGISTER_GPU_VASPACE, lay.UVM_UNREGISTER_GPU_VASPACE,
            lay.UVM_REGISTER_CHANNEL, lay.UVM_UNREGISTER_CHANNEL,
            lay.UVM_MAP_EXTERNAL_ALLOCATION, lay.UVM_FREE, lay.UVM_REGISTER_GPU,
            lay.UVM_UNREGISTER_GPU, lay.UVM_CREATE_EXTERNAL_RANGE, lay.UVM_MM_INITIALIZE) == (
            25, 26, 27, 28, 33, 34, 37, 38, 73, 75)
    assert lay.MAX_CARDS == 32


def test_ioctl_ffi_is_cached() -> None:
    assert ioctl_ffi("580") is ioctl_ffi("580")
