"""Machines behind a transport: listing, config space, BAR access and reset reach a machine
that is no sysfs tree (here a simulated function, in memory), and what needs this process's
memory is refused there clearly."""

from pathlib import Path

import pytest

from rig_edge import RigError
from rig_pci import Bar, DmaMemory, Function, FunctionInfo, Machine, Window, driver
from rig_pci.listing import IORESOURCE_MEM
from rig_pci.sysfs import SysfsTransport
from rig_pci.transport import Access, Transport

BUS = "0000:09:00.0"


class Registers(Window):
    """A window onto a dict of registers, as a remote machine's agent would answer."""

    def __init__(self, size: int, name: str, regs: dict[int, int], log: list[str]) -> None:
        super().__init__(size, name)
        self.regs, self.log = regs, log

    def _read(self, offset: int, width: int) -> int:
        self.log.append(f"read{8 * width} {self.name} 0x{offset:x}")
        return self.regs.get(offset, 0)

    def _write(self, offset: int, width: int, value: int) -> None:
        self.log.append(f"write{8 * width} {self.name} 0x{offset:x} 0x{value:x}")
        self.regs[offset] = value

    def close(self) -> None:
        self.log.append(f"close {self.name}")


class Simulated:
    """A function on another machine, reached through messages (here: method calls)."""

    how = "over the wire"
    maps_host = False
    can_reset = True
    dma_granule = 4096

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.cfg = Registers(256, "config", {0: 0x1234, 4: 0x0006}, log)

    def config(self) -> Window:
        return self.cfg

    def window(self, bar: int, offset: int, length: int, write_combined: bool) -> Window:
        return Registers(length, f"bar{bar}", {}, self.log)

    def reset(self) -> None:
        self.log.append("reset")

    def alloc_dma(self, n: int, at: int | None) -> DmaMemory | None:
        raise AssertionError("never asked: the machine's memory is not this process's")

    def map_host(self, address: int, length: int) -> DmaMemory | None:
        raise AssertionError("never asked")

    def close(self) -> None:
        self.log.append("close")


class Remote:
    name = "the machine over the wire"
    shares_memory = False

    def __init__(self) -> None:
        self.log: list[str] = []

    def functions(self) -> list[FunctionInfo]:
        return [self.function(BUS)]

    def function(self, address: str) -> FunctionInfo:
        bar = Bar(0, 0xF000_0000, 1 << 24, IORESOURCE_MEM)
        return FunctionInfo(address, 0x1234, 0x5678, 0x030200, (bar,), None, None, "active")

    def take(self, address: str) -> Access:
        self.log.append(f"take {address}")
        return Simulated(self.log)


def test_a_transport_carries_listing_config_bars_and_reset() -> None:
    remote = Remote()
    transport: Transport = remote
    machine = Machine(transport)
    assert [f.address for f in machine.functions()] == [BUS]
    assert not machine.is_this and "over the wire" in repr(machine)
    with Function.take(machine, BUS) as f:
        assert f.how == "over the wire" and f.alive()
        f.window(0, 0x1000, 0x1000).write32(0x10, 0xCAFE)
        f.reset()
    assert remote.log == [
        f"take {BUS}",
        "read16 config 0x0",  # alive
        "write32 bar0 0x10 0xcafe",
        "read16 config 0x0",  # reset: alive, so bus mastering is turned off
        "read16 config 0x4",
        "write16 config 0x4 0x2",
        "reset",
        "read16 config 0x0",  # answers again
        "close bar0",
        "close",
    ]


def test_what_needs_this_process_memory_is_refused_clearly() -> None:
    machine = Machine(Remote())
    with (
        Function.take(machine, BUS) as f,
        pytest.raises(RigError, match="the machine over the wire's memory is not this"),
    ):
        f.alloc_dma(1 << 20)
    with pytest.raises(RigError, match="needs a program there"):
        driver.attach(machine, BUS)


def test_machines_this_and_at() -> None:
    this = Machine.this()
    assert this.is_this and this.name == "this machine"
    assert isinstance(this.transport, SysfsTransport) and this.transport.root == Path("/")
    assert this.functions() == Machine.at("/").functions()  # the same files
    there = Machine.at("/tmp")
    assert not there.is_this and there.name == "the machine at /tmp"
