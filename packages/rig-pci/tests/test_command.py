"""Function.memory_space and Function.bus_master on fixture trees, taken physically (the sysfs
config file) and through VFIO (its config region): each sets or clears its one bit of the
command register (include/uapi/linux/pci_regs.h PCI_COMMAND 0x04: MEMORY bit 1, MASTER bit 2)
and leaves the others, writes nothing when the bit is as asked, and refuses a bit that reads
back clear after being turned on."""

import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_take_vfio import SHIFT, vfio_device

from rig_edge import Misuse, RigError
from rig_pci import Function, Machine
from rig_pci.testing import config_space, fixture_machine

MakeDevice = Callable[..., Path]
INTX_DISABLE = 0x400  # PCI_COMMAND_INTX_DISABLE, a bit neither call touches


def physical(tmp_path: Path, make_device: MakeDevice, command: int) -> tuple[Function, Path, int]:
    """A function as Linux leaves it after its driver let it go, taken physically: its config
    file (offset 0 there) and the command register ``command``."""
    dev = make_device(config=config_space(0x1234, 0x5678, 0x030200, command=command))
    machine, _ = fixture_machine(tmp_path)
    return Function.take(machine, dev.name), dev / "config", 0


def through_vfio(tmp_path: Path, make_device: MakeDevice, command: int
                 ) -> tuple[Function, Path, int]:
    """The same through VFIO: its config region (7) of the fake device file."""
    dev, fake = vfio_device(tmp_path, make_device)
    with open(fake.device, "r+b") as f:
        f.seek((7 << SHIFT) + 4)
        f.write(struct.pack("<H", command))
    return Function.take(Machine.at(tmp_path, ioctl=fake), dev.name), fake.device, 7 << SHIFT


def command_of(path: Path, base: int) -> int:
    return int(struct.unpack_from("<H", path.read_bytes(), base + 4)[0])


TAKES = [physical, through_vfio]


@pytest.mark.parametrize("take", TAKES, ids=["physically", "VFIO"])
def test_bus_master_and_memory_space_set_and_clear_their_bit_alone(
    tmp_path: Path, make_device: MakeDevice,
    take: Callable[[Path, MakeDevice, int], tuple[Function, Path, int]],
) -> None:
    """From a command register with both off (pci_disable_device clears MASTER; a function no
    driver enabled may have MEMORY clear too), each call sets its bit and keeps the others."""
    f, path, base = take(tmp_path, make_device, INTX_DISABLE)
    with f:
        f.memory_space(True)
        assert command_of(path, base) == INTX_DISABLE | 0x2
        f.bus_master(True)
        assert command_of(path, base) == INTX_DISABLE | 0x6
        f.bus_master(True)  # already on: unchanged
        assert f.config.read16(4) == INTX_DISABLE | 0x6
        f.bus_master(False)
        assert command_of(path, base) == INTX_DISABLE | 0x2
        f.memory_space(False)
        assert command_of(path, base) == INTX_DISABLE


def test_a_bit_that_does_not_stick_is_refused(tmp_path: Path, make_device: MakeDevice) -> None:
    """A command register that drops the write (a function that ignores it) is refused,
    naming what it reads back; turning a bit off checks nothing."""
    f, path, _ = physical(tmp_path, make_device, 0)

    class Dropping:  # the config window, its writes dropped
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def read16(self, offset: int) -> int:
            return int(self.inner.read16(offset))  # type: ignore[attr-defined]

        def write16(self, offset: int, value: int) -> None:
            pass

    with f:
        f.config = Dropping(f.config)  # type: ignore[assignment]
        with pytest.raises(RigError, match=r"0000:01:00.0: its bus mastering stays off \(its "
                           r"command register reads 0x0000 after 0x0004 was written\)"):
            f.bus_master(True)
        with pytest.raises(RigError, match="its memory space decoding stays off"):
            f.memory_space(True)
        f.bus_master(False)
    assert command_of(path, 0) == 0


def test_a_released_function_is_misuse(tmp_path: Path, make_device: MakeDevice) -> None:
    f, _, _ = physical(tmp_path, make_device, 0x6)
    f.close()
    for call in (f.bus_master, f.memory_space):
        with pytest.raises(Misuse, match="was released"):
            call(True)

