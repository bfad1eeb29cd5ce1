"""The kernel driver's ioctl structs per driver release, declared once, as cffi types.

/dev/nvidiactl and /dev/nvidiaN: kernel-open/common/inc/nv-ioctl.h and nv-ioctl-numbers.h,
src/common/sdk/nvidia/inc/nvos.h, src/nvidia/arch/nvalloc/unix/include/nv_escape.h and
nv-unix-nvos-params-wrappers.h. /dev/nvidia-uvm: kernel-open/nvidia-uvm/uvm_ioctl.h,
uvm_linux_ioctl.h and uvm_types.h. All of open-gpu-kernel-modules at tags 570.211.01 and
580.142; the layouts below are the same in both releases (UVM_FREE loses its length only from
595 on, which rig does not accept). NvP64 is uint64_t. Sizes are asserted in the tests.
"""

from __future__ import annotations

import functools

from cffi import FFI

from rig_nv import prebuilt
from rig_nv.layouts import SUPPORTED

# Escape numbers (nv-ioctl-numbers.h, nv_escape.h). The request is _IOWR('F', nr, size).
NV_ESC_RM_ALLOC_MEMORY = 0x27
NV_ESC_RM_FREE = 0x29
NV_ESC_RM_CONTROL = 0x2A
NV_ESC_RM_ALLOC = 0x2B
NV_ESC_RM_MAP_MEMORY = 0x4E
NV_ESC_RM_UNMAP_MEMORY = 0x4F
NV_ESC_CARD_INFO = 200
NV_ESC_REGISTER_FD = 201
NV_ESC_CHECK_VERSION_STR = 210
NV_ESC_EXPORT_TO_DMABUF_FD = 217

# UVM commands are plain numbers (uvm_ioctl.h: UVM_IOCTL_BASE(i) is i on Linux).
UVM_INITIALIZE = 0x30000001
UVM_REGISTER_GPU_VASPACE = 25
UVM_UNREGISTER_GPU_VASPACE = 26
UVM_REGISTER_CHANNEL = 27
UVM_UNREGISTER_CHANNEL = 28
UVM_ENABLE_PEER_ACCESS = 29
UVM_MAP_EXTERNAL_ALLOCATION = 33
UVM_FREE = 34
UVM_REGISTER_GPU = 37
UVM_UNREGISTER_GPU = 38
UVM_UNMAP_EXTERNAL = 66
UVM_CREATE_EXTERNAL_RANGE = 73
UVM_MM_INITIALIZE = 75

# How many cards NV_ESC_CARD_INFO fills; the array must be at least the number of GPUs
# (nv-ioctl.h; NV_MAX_DEVICES is 32).
MAX_CARDS = 32

_CDEF = """
typedef struct { uint32_t domain; uint8_t bus; uint8_t slot; uint8_t function;
                 uint16_t vendor_id; uint16_t device_id; } nv_pci_info_t;
typedef struct {
    uint8_t valid; nv_pci_info_t pci_info; uint32_t gpu_id; uint16_t interrupt_line;
    uint64_t reg_address; uint64_t reg_size; uint64_t fb_address; uint64_t fb_size;
    uint32_t minor_number; uint8_t dev_name[10];
} nv_ioctl_card_info_t;
typedef struct { int ctl_fd; } nv_ioctl_register_fd_t;
typedef struct { uint32_t cmd; uint32_t reply; char versionString[64]; } nv_ioctl_rm_api_version_t;
typedef struct {
    int fd; uint32_t hClient; uint32_t totalObjects; uint32_t numObjects; uint32_t index;
    uint64_t totalSize; uint8_t mappingType; uint8_t bAllowMmap; uint32_t handles[128];
    uint64_t offsets[128]; uint64_t sizes[128]; uint32_t status;
} nv_ioctl_export_to_dma_buf_fd_t;

typedef struct { uint32_t hRoot; uint32_t hObjectParent; uint32_t hObjectNew; uint32_t hClass;
                 uint64_t pAllocParms; uint32_t paramsSize; uint32_t status; } NVOS21_PARAMETERS;
typedef struct { uint32_t hClient; uint32_t hObject; uint32_t cmd; uint32_t flags;
                 uint64_t params; uint32_t paramsSize; uint32_t status; } NVOS54_PARAMETERS;
typedef struct { uint32_t hRoot; uint32_t hObjectParent; uint32_t hObjectOld; uint32_t status; } NVOS00_PARAMETERS;
typedef struct { uint32_t hRoot; uint32_t hObjectParent; uint32_t hObjectNew; uint32_t hClass;
                 uint32_t flags; uint64_t pMemory; uint64_t limit; uint32_t status; } NVOS02_PARAMETERS;
typedef struct { NVOS02_PARAMETERS params; int fd; } nv_ioctl_nvos02_parameters_with_fd;
typedef struct { uint32_t hClient; uint32_t hDevice; uint32_t hMemory; uint64_t offset;
                 uint64_t length; uint64_t pLinearAddress; uint32_t status; uint32_t flags; } NVOS33_PARAMETERS;
typedef struct { NVOS33_PARAMETERS params; int fd; } nv_ioctl_nvos33_parameters_with_fd;
typedef struct { uint32_t hClient; uint32_t hDevice; uint32_t hMemory; uint64_t pLinearAddress;
                 uint32_t status; uint32_t flags; } NVOS34_PARAMETERS;

typedef struct { uint8_t uuid[16]; } NvProcessorUuid;
typedef struct { uint64_t flags; uint32_t rmStatus; } UVM_INITIALIZE_PARAMS;
typedef struct { int uvmFd; uint32_t rmStatus; } UVM_MM_INITIALIZE_PARAMS;
typedef struct { NvProcessorUuid gpu_uuid; uint8_t numaEnabled; int32_t numaNodeId; int32_t rmCtrlFd;
                 uint32_t hClient; uint32_t hSmcPartRef; uint32_t rmStatus; } UVM_REGISTER_GPU_PARAMS;
typedef struct { NvProcessorUuid gpu_uuid; uint32_t rmStatus; } UVM_UNREGISTER_GPU_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; int32_t rmCtrlFd; uint32_t hClient; uint32_t hVaSpace;
                 uint32_t rmStatus; } UVM_REGISTER_GPU_VASPACE_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; uint32_t rmStatus; } UVM_UNREGISTER_GPU_VASPACE_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; int32_t rmCtrlFd; uint32_t hClient; uint32_t hChannel;
                 uint64_t base; uint64_t length; uint32_t rmStatus; } UVM_REGISTER_CHANNEL_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; uint32_t hClient; uint32_t hChannel; uint32_t rmStatus; } UVM_UNREGISTER_CHANNEL_PARAMS;
typedef struct { uint64_t base; uint64_t length; uint32_t rmStatus; } UVM_CREATE_EXTERNAL_RANGE_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; uint32_t gpuMappingType; uint32_t gpuCachingType;
                 uint32_t gpuFormatType; uint32_t gpuElementBits; uint32_t gpuCompressionType; } UvmGpuMappingAttributes;
typedef struct { uint64_t base; uint64_t length; uint64_t offset; UvmGpuMappingAttributes perGpuAttributes[256];
                 uint64_t gpuAttributesCount; int32_t rmCtrlFd; uint32_t hClient; uint32_t hMemory;
                 uint32_t rmStatus; } UVM_MAP_EXTERNAL_ALLOCATION_PARAMS;
typedef struct { uint64_t base; uint64_t length; uint32_t rmStatus; } UVM_FREE_PARAMS;
typedef struct { NvProcessorUuid gpuUuidA; NvProcessorUuid gpuUuidB; uint32_t rmStatus; } UVM_ENABLE_PEER_ACCESS_PARAMS;
typedef struct { uint64_t base; uint64_t length; NvProcessorUuid gpuUuid; uint32_t rmStatus; } UVM_UNMAP_EXTERNAL_PARAMS;
"""

# The generated module holding these declarations parsed (rig_nv.prebuilt; regenerated by
# `python3 scripts/gen_ffi.py`). Every supported release has the same ioctl declarations, so
# one module serves all; a release whose layouts differ gets a text and a module of its own.
PREBUILT = {"rig_nv_nvidia._ffi_ioctl": _CDEF}


@functools.cache
def ioctl_ffi(key: str) -> FFI:
    """The cffi types of the kernel driver's ioctls for layout set ``key`` ("570" or "580").

    Loaded from the generated module ``rig_nv_nvidia._ffi_ioctl`` (about a millisecond),
    parsed only where that is absent or stale (:func:`rig_nv.prebuilt.load`); every supported
    set is loaded when this module is imported (below).
    """
    return prebuilt.load("rig_nv_nvidia._ffi_ioctl", _CDEF)


# Load every layout set now, not at a GPU's first open: importing a generated module opens its
# file, which an open at RLIMIT_NOFILE must not need (tests/test_gpu_walks.py opens so), and a
# module's import is a millisecond.
for _key in SUPPORTED:
    ioctl_ffi(_key)


def nv_request(nr: int, size: int) -> int:
    """``_IOWR('F', nr, size)``: the request number of escape ``nr`` carrying ``size`` bytes."""
    return (3 << 30) | (size << 16) | (ord("F") << 8) | nr
