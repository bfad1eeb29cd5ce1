"""What a GPU is, known from its PCI device id alone (no GPU opened, nothing heavy imported).

The device ids and product names are those of the supported-GPU table in the README of NVIDIA's
open-gpu-kernel-modules (checked against release 595.45.04), which lists each product by its PCI
device id; the chip names are the PCI ID repository's (pci.ids: e.g. ``2335  GH100 [H200 SXM
141GB]``); the architectures are CUDA's compute capabilities of those chips. A device id not in
the table has ``None`` for each: ``rig info`` opens the GPU and reads its architecture from it.
"""

from __future__ import annotations

from dataclasses import dataclass

# PCI vendor id of NVIDIA and the class codes of a GPU (0x0300 VGA controller, 0x0302 3D
# controller), as rig_nv.is_gpu has them: repeated here so that `rig list` need not import
# rig_nv (and cffi with it). tests/test_cli.py checks that both agree.
NVIDIA = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)

@dataclass(frozen=True)
class Chip:
    """A product (``name``), its chip and its compute architecture (``None`` where unknown)."""

    name: str | None
    chip: str | None
    arch: str | None


CHIPS: dict[int, Chip] = {
    0x2335: Chip("H200", "GH100", "sm_90"),
    0x2330: Chip("H100 SXM5", "GH100", "sm_90"),
    0x2331: Chip("H100 PCIe", "GH100", "sm_90"),
    0x20B0: Chip("A100 SXM4 40GB", "GA100", "sm_80"),
    0x20B2: Chip("A100 SXM4 80GB", "GA100", "sm_80"),
    0x20F1: Chip("A100 PCIe 40GB", "GA100", "sm_80"),
    0x26B9: Chip("L40S", "AD102", "sm_89"),
    0x2684: Chip("GeForce RTX 4090", "AD102", "sm_89"),
    0x2204: Chip("GeForce RTX 3090", "GA102", "sm_86"),
    0x2901: Chip("B200", "GB100", "sm_100"),
    0x2B85: Chip("GeForce RTX 5090", "GB202", "sm_120"),
}


def chip(device_id: int) -> Chip:
    """The product, chip and architecture of PCI device ``device_id`` (``None`` each where the
    table does not have it)."""
    return CHIPS.get(device_id, Chip(None, None, None))


def is_gpu(vendor: int, class_code: int) -> bool:
    """Whether a PCI function is an NVIDIA GPU (not its audio or USB function)."""
    return vendor == NVIDIA and (class_code >> 8) in GPU_CLASSES
