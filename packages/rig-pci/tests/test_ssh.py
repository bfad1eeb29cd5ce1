"""Machine.ssh against a real SSH server on 127.0.0.1 (asyncssh's, tests/ssh_server.py) run by
OpenSSH's ssh client, the agent serving a fixture sysfs tree as the other machine (issue 21)."""

import fcntl
import os
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from rig_edge import Misuse, RigError
from rig_pci import Function, Machine, locks, ssh
from rig_pci.function import ResetFailed
from rig_pci.testing import add_function

sys.path.insert(0, str(Path(__file__).parent))
from ssh_server import Server, needs_ssh  # conftest.py gives the sshd fixture

pytestmark = needs_ssh
BUS, NIC = "0000:01:00.0", "0000:02:00.0"


def tree(root: Path) -> Path:
    """A GPU with BAR 0 and a prefetchable BAR 1 in IOMMU group 7 (identity) and no driver,
    and a NIC with its driver; returns the GPU's directory."""
    dev = add_function(root, BUS, vendor=0x10DE, device=0x2204, class_code=0x030000,
                       bars={0: (0xF000_0000, 1 << 20, False), 1: (0xE000_0000, 4 << 20, True)},
                       iommu_group=7, iommu_type="identity")
    add_function(root, NIC, vendor=0x8086, device=0x1572, class_code=0x020000,
                 bars={0: (0xD000_0000, 1 << 16, False)}, driver="i40e", runtime_status=None)
    return dev


def started(server: Server) -> int:
    return server.sessions


# ---- what goes through it ------------------------------------------------------------------


def test_the_listing_over_ssh_equals_the_local_listing_of_the_same_tree(
        tmp_path: Path, sshd: Server) -> None:
    tree(tmp_path)
    with sshd.machine(tmp_path) as there:
        assert there.functions() == Machine.at(tmp_path).functions()
        assert there.function(NIC) == Machine.at(tmp_path).function(NIC)
        assert there.name == f"the machine at ssh://127.0.0.1:{sshd.port}{tmp_path}"
        assert not there.is_this


def test_config_space_bar_registers_and_reset_reach_the_other_machine(
        tmp_path: Path, sshd: Server) -> None:
    dev = tree(tmp_path)
    with open(dev / "resource0", "r+b") as f:
        f.seek(0xA00)
        f.write(struct.pack("<I", 0x172A1000))
    with sshd.machine(tmp_path) as there, Function.take(there, BUS) as f:
        assert f.how == "physically, over SSH"
        assert f.config.read16(0) == 0x10DE  # read there, from the tree's config file
        w = f.window(0, 0, 0x1000)
        assert w.read32(0xA00) == 0x172A1000
        w.write32(0x10, 0xDEADBEEF)
        assert f.bus_master(False) is True
        assert f.can_reset
        f.reset()
        # what the agent did, read from the tree's files, not through the code under test
        with open(dev / "resource0", "rb") as r:
            r.seek(0x10)
            assert r.read(4) == struct.pack("<I", 0xDEADBEEF)
        assert struct.unpack_from("<H", (dev / "config").read_bytes(), 4)[0] & 0x4 == 0
        assert (dev / "reset").read_text() == "1"
        with pytest.raises(RigError, match="memory is not this process's"):
            f.alloc_dma(4096)


def test_a_function_taken_over_ssh_is_held_there_until_released(
        tmp_path: Path, sshd: Server) -> None:
    """The agent's take locks the function's config file there: another process (this one,
    taking locally) is kept off until the function is released."""
    tree(tmp_path)
    with sshd.machine(tmp_path) as there:
        f = Function.take(there, BUS)
        with pytest.raises(RigError, match="another holder"):
            Function.take(Machine.at(tmp_path), BUS)
        f.close()
        Function.take(Machine.at(tmp_path), BUS).close()


def test_a_lock_is_taken_there_by_the_agent_for_as_long_as_it_is_held(
        tmp_path: Path, sshd: Server) -> None:
    tree(tmp_path)
    file = tmp_path / "run/lock/rig-test.lock"  # the tree's own /run/lock
    with sshd.machine(tmp_path) as there:
        held = there.transport.lock("rig-test.lock")  # type: ignore[attr-defined]
        with pytest.raises(RigError, match="another process holds it"):
            locks.FileLock.take(file)
        held.release()
        locks.FileLock.take(file).release()
        held = there.transport.lock("rig-test.lock")  # type: ignore[attr-defined]
    # closing the machine ended the agent, whose exit let the lock go
    deadline = time.monotonic() + 5
    while True:
        fd = os.open(file, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            assert time.monotonic() < deadline, "the agent kept the lock after close"
            time.sleep(0.05)
        finally:
            os.close(fd)


def test_one_connection_serves_many_calls_from_many_threads(
        tmp_path: Path, sshd: Server) -> None:
    dev = tree(tmp_path)
    with open(dev / "resource0", "r+b") as f:
        f.write(bytes(range(256)) * 16)
    with sshd.machine(tmp_path) as there, Function.take(there, BUS) as f:
        w = f.window(0, 0, 0x1000)
        wrong: list[str] = []

        def reader(k: int) -> None:
            for i in range(40):
                at = 4 * ((k * 40 + i) % 1024)
                want = int.from_bytes(bytes((at + j) % 256 for j in range(4)), "little")
                if w.read32(at) != want:
                    wrong.append(f"0x{at:x}")
                there.functions()

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []
        assert started(sshd) == 1


def test_a_closed_machine_refuses_calls_and_an_ended_connection_is_started_again(
        tmp_path: Path, sshd: Server) -> None:
    tree(tmp_path)
    there = sshd.machine(tmp_path)
    there.functions()
    sshd.drop()
    deadline = time.monotonic() + 5
    while True:  # the next listing starts a new connection once the old one is seen ended
        try:
            assert len(there.functions()) == 2
            break
        except RigError:
            assert time.monotonic() < deadline
    assert started(sshd) == 2
    there.close()
    with pytest.raises(Misuse, match="was closed"):
        there.functions()


# ---- failures ------------------------------------------------------------------------------


def test_ssh_refusing_is_an_error_with_ssh_s_own_message(tmp_path: Path, sshd: Server) -> None:
    import asyncssh

    tree(tmp_path)
    name = f"the machine at ssh://127.0.0.1:{sshd.port}{tmp_path}"
    sshd.trust(asyncssh.generate_private_key("ssh-ed25519"))  # another host key expected
    with pytest.raises(RigError) as e:
        sshd.machine(tmp_path).functions()
    assert str(e.value).startswith(f"{name}: it cannot be reached: ssh exited with status 255")
    assert "Host key verification failed" in str(e.value)
    sshd.trust(sshd.host_key)
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    other = tmp_path / "other_key"
    stranger.write_private_key(str(other))
    other.chmod(0o600)
    m = Machine(ssh.SshTransport("127.0.0.1", port=sshd.port, options=sshd.options(other),
                                 root=str(tmp_path)))
    with pytest.raises(RigError, match=r"it cannot be reached: .*Permission denied"):
        m.functions()
    sshd.close()  # nothing listens on the port now
    with pytest.raises(RigError, match=r"it cannot be reached: .*Connection refused"):
        sshd.machine(tmp_path).functions()


def fake_python(sshd: Server, tmp_path: Path, body: str) -> None:
    """Put a python3 on the server's PATH that runs ``body`` (sh) with the agent's code in
    $2 (the agent is started as ``python3 -c CODE``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "python3"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    sshd.env["PATH"] = f"{bin_dir}:/usr/bin:/bin"


def test_a_machine_without_python_3_11_is_an_error_saying_so(tmp_path: Path, sshd: Server) -> None:
    tree(tmp_path)
    sshd.env["PATH"] = str(tmp_path / "nowhere")  # no python3 at all
    with pytest.raises(RigError) as e:
        sshd.machine(tmp_path).functions()
    assert "it cannot run rig's agent: it has no python3 (rig needs Python 3.11 there)" in str(
        e.value)
    assert "status 127" in str(e.value)
    # a python3 that is 3.8: the real interpreter running the agent's code as 3.8 reports
    fake_python(sshd, tmp_path, f"exec {sys.executable} -c 'import sys; sys.version_info = "
                f"(3, 8, 10, \"final\", 0); exec(sys.argv[1])' \"$2\"")
    with pytest.raises(RigError) as e:
        sshd.machine(tmp_path).functions()
    assert str(e.value) == (f"the machine at ssh://127.0.0.1:{sshd.port}{tmp_path}: it cannot "
                            "run rig's agent: its python3 is Python 3.8, and the agent needs "
                            "3.11 or later")


def agent_program(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(ssh, "program", lambda root: zlib.compress(text.encode()))


def test_an_agent_of_another_protocol_version_is_refused(
        tmp_path: Path, sshd: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    real = zlib.decompress(ssh.program(str(tmp_path))).decode()
    assert "PROTOCOL = 1\\n" in real
    agent_program(monkeypatch, real.replace("PROTOCOL = 1\\n", "PROTOCOL = 2\\n"))
    with pytest.raises(RigError, match=r"its agent speaks protocol version 2, and this rig "
                                       r"speaks 1$"):
        sshd.machine(tmp_path).functions()


def test_what_is_not_the_protocol_is_an_error(
        tmp_path: Path, sshd: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    tree(tmp_path)
    # a chatty wrapper writes before the agent starts
    fake_python(sshd, tmp_path, f"echo 'Welcome to the lab!'\nexec {sys.executable} \"$@\"")
    with pytest.raises(RigError, match=r"not rig's agent protocol: it began b'Welcome to the "):
        sshd.machine(tmp_path).functions()
    sshd.env["PATH"] = os.environ["PATH"]
    # an agent whose reply to the first request is no frame
    agent_program(monkeypatch, "import sys\no = sys.stdout.buffer\n"
                  "o.write(b'rig-pci-agent 1\\n'); o.flush()\nsys.stdin.buffer.read(4)\n"
                  "o.write(b'\\xff\\xff\\xff\\xffjunk'); o.flush()\nsys.stdin.buffer.read()\n")
    with pytest.raises(RigError) as e:
        sshd.machine(tmp_path).functions()
    assert "its agent's reply is not the protocol's: a frame of 4294967295 bytes" in str(e.value)
    assert "whether functions was done is unknown" in str(e.value)


def test_an_agent_that_fails_inside_a_call_answers_so_at_once(
        tmp_path: Path, sshd: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    tree(tmp_path)
    real = zlib.decompress(ssh.program(str(tmp_path))).decode()
    line = "def functions(self) -> list[dict[str, Any]]:\\n"
    assert line in real
    agent_program(monkeypatch, real.replace(line, line + "        1 / 0\\n"))
    with sshd.machine(tmp_path, timeout_s=20) as there:
        t = time.monotonic()
        with pytest.raises(RigError, match="rig's agent failed at functions: "
                                           "ZeroDivisionError: division by zero"):
            there.functions()
        assert time.monotonic() - t < 10
        assert there.function(NIC).vendor == 0x8086


def blocking(dev: Path, name: str) -> None:
    """Make the function's file ``name`` a FIFO, on which the agent's open waits forever."""
    (dev / name).unlink()
    os.mkfifo(dev / name)


def test_a_call_past_its_timeout_is_an_error_and_the_connection_goes_on(
        tmp_path: Path, sshd: Server) -> None:
    tree(tmp_path)
    blocking(Path(os.path.realpath(tmp_path / "sys/bus/pci/devices" / BUS)), "vendor")
    with sshd.machine(tmp_path, timeout_s=1.5) as there:
        t = time.monotonic()
        with pytest.raises(RigError) as e:
            there.functions()
        assert time.monotonic() - t < 5
        assert str(e.value) == (f"{there.name}: functions got no answer within 1.5 s "
                                "(whether functions was done is unknown)")
        assert there.function(NIC).vendor == 0x8086  # the same connection answers others
        assert started(sshd) == 1


def test_a_connection_dropping_mid_call_is_an_error_and_nothing_half_done_is_done(
        tmp_path: Path, sshd: Server) -> None:
    dev = Path(os.path.realpath(tree(tmp_path)))
    blocking(dev, "reset")  # the agent's write of the reset waits
    with sshd.machine(tmp_path) as there:
        f = Function.take(there, BUS)
        got: list[BaseException] = []

        def reset() -> None:
            try:
                f.reset()
            except BaseException as e:
                got.append(e)

        t = threading.Thread(target=reset)
        t.start()
        time.sleep(0.5)
        assert t.is_alive()  # the reset is in flight
        sshd.drop()
        t.join(10)
        assert not t.is_alive()
        (e,) = got
        assert isinstance(e, ResetFailed)  # not reported as done
        assert f"{there.name}: the connection ended (ssh exited with status 255" in str(e)
        assert "during reset (whether reset was done is unknown)" in str(e)
        with pytest.raises(RigError, match="the connection ended"):
            f.config.read16(0)
        f.close()  # the agent's exit let the function go: closing asks nothing of it
