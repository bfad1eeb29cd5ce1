from dataclasses import dataclass

from rig_nv import is_gpu


@dataclass
class Fn:
    vendor: int
    class_code: int


def test_nvidia_display_and_3d_controllers_are_gpus() -> None:
    assert is_gpu(Fn(0x10DE, 0x030200))
    assert is_gpu(Fn(0x10DE, 0x030000))


def test_others_are_not() -> None:
    assert not is_gpu(Fn(0x10DE, 0x040300))  # the GPU's HD audio function
    assert not is_gpu(Fn(0x1002, 0x030000))  # another vendor's GPU
