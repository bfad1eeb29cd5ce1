"""A host-visible region's bytes as CPU memory: a memoryview, numpy's array interface, DLPack.

Every view is 1-D ``uint8`` over ``region.host`` for ``region.length`` bytes, as cuda.core's
Buffer offers host memory. No view copies, and none keeps the memory: a view is valid until
the region is freed or its device stops; using it after that is undefined, as with any pointer.
A region's ``gpu`` address is in rig's own GPU address space, not CUDA's, so no view here
speaks of the GPU, and Device memory (no ``host``) has none.

DLPack's structs come from dmlc/dlpack's include/dlpack/dlpack.h: ``DLManagedTensorVersioned``
(v1.0, a "dltensor_versioned" capsule, for consumers that ask for ``max_version >= (1, 0)``)
and the older ``DLManagedTensor`` (a "dltensor" capsule, which numpy imports read-only).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from rig_edge.errors import Misuse

if TYPE_CHECKING:
    from rig_edge.memory import Region

KDL_CPU = 1  # DLDeviceType kDLCPU
KDL_UINT = 1  # DLDataTypeCode kDLUInt


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


class _DLManagedTensorVersioned(ctypes.Structure):
    pass


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


# Both deleters are called with the struct's address: one C signature serves both.
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]
_DLManagedTensorVersioned._fields_ = [
    ("version", _DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
    ("flags", ctypes.c_uint64),  # 0: writable, not a copy
    ("dl_tensor", _DLTensor),
]

# The destructor takes the capsule as a bare pointer: a py_object would take a reference to
# an object being deallocated and free it a second time.
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NAMES = (b"dltensor", b"dltensor_versioned")
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# Each exported tensor's ctypes objects, kept alive until its consumer calls the deleter.
_live: dict[int, tuple[ctypes.Structure, ctypes.Array[ctypes.c_int64]]] = {}


def _delete(address: int) -> None:
    _live.pop(address, None)


def _unconsumed(capsule: int) -> None:
    # A capsule still under its first name was never consumed: its producer deletes the
    # tensor (dlpack.h); a consumer renames it "used_dltensor..." and calls the deleter.
    for name in _NAMES:
        if _capsule_valid(capsule, name):
            _live.pop(_capsule_pointer(capsule, name), None)


# The C callbacks, made once and kept for the process (a capsule may outlive any caller).
_delete_c = _DELETER(_delete)
_unconsumed_c = _CAPSULE_DESTRUCTOR(_unconsumed)


def host_of(region: Region) -> int:
    """The region's host address; raises :class:`Misuse` for a region the host does not see."""
    if region.host is None:
        raise Misuse(f"{region.kind.value} memory at GPU address {region.gpu:#x} has no host "
                     "address: only Pinned, Mapped and map_host regions can be viewed")
    return region.host


def view(region: Region) -> memoryview:
    """A writable 1-D memoryview of ``B`` (unsigned bytes) over the region's host memory."""
    array = (ctypes.c_uint8 * region.length).from_address(host_of(region))
    return memoryview(array).cast("B")


def array_interface(region: Region) -> dict[str, Any]:
    """numpy's ``__array_interface__`` (version 3) for the region: 1-D, ``uint8``, writable."""
    return {"shape": (region.length,), "typestr": "|u1", "data": (host_of(region), False),
            "strides": None, "version": 3}


def dlpack(region: Region, versioned: bool) -> object:
    """A capsule of the region as a 1-D ``uint8`` CPU tensor (DLPack): "dltensor_versioned"
    (DLPack 1.0, writable) if ``versioned``, else "dltensor"."""
    host = host_of(region)
    shape = (ctypes.c_int64 * 1)(region.length)
    managed: _DLManagedTensor | _DLManagedTensorVersioned
    if versioned:
        managed = _DLManagedTensorVersioned()
        managed.version = _DLPackVersion(1, 0)
    else:
        managed = _DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = host
    tensor.device = _DLDevice(KDL_CPU, 0)
    tensor.ndim = 1
    tensor.dtype = _DLDataType(KDL_UINT, 8, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # compact, row-major
    managed.deleter = _delete_c
    address = ctypes.addressof(managed)
    _live[address] = (managed, shape)
    return _capsule_new(address, _NAMES[versioned], _unconsumed_c)


def live_exports() -> int:
    """How many DLPack tensors are exported and not yet deleted by their consumers."""
    return len(_live)
