"""Faults on a real GPU, each in a fresh process so a bad outcome cannot poison this one.

Spec ("Faults and stopping"): a kernel that faults is reported from wait as a Fault naming the
channel error; the device is then lost (every use raises Lost, its facts still answer); after a
stop, gpu(0).open() in the same process gives a working device.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
CUBIN = Path(__file__).resolve().parents[2] / "rig-nv" / "tests" / "cubins" / "kernels.sm_90.cubin"

# The end of every faulting child: stop the lost device, open GPU 0 again in the same process
# and check a vadd of fresh random data (the child sets vadd_cubin, the kernels' path).
REOPEN = textwrap.dedent("""
    d.stop()
    d = rig_nv_nvidia.gpu(0).open()
    kernels = d.load(open(vadd_cubin, "rb").read())
    a = np.random.default_rng().random(1024, dtype=np.float32)
    r = d.alloc(4096, Memory.DEVICE); o = d.alloc(4096, Memory.DEVICE)
    d.upload(r, a.tobytes())
    d.launch(kernels["vadd"], (4,), (256,), (r, r, o, 1024)).wait()
    got = np.frombuffer(bytes(d.download(o)), dtype=np.float32)
    print("REOPENED", bool(np.array_equal(got, a + a)))
    d.stop()
""")

CHILD = textwrap.dedent("""
    import numpy as np, sys
    import rig_nv_nvidia
    from rig_edge import Fault, Lost, Memory, Region, RigError
    from rig_nv.faults import read_fault_records
    cubin, kernel = open(sys.argv[1], "rb").read(), sys.argv[2]
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(cubin)
    bad = Region({address}, None, 1 << 20, Memory.DEVICE)
    args = (bad, bad, bad, 1024) if kernel == "vadd" else (bad,)
    try:
        d.launch(img[kernel], (4,), (256,), args).wait(timeout_s=60)
        print("NO FAULT")
        sys.exit(1)
    except Fault as e:
        print("FAULT", e.channel_error, "|", e.address, "|", e.access, "|", e.engine)
    try:
        d.alloc(4096, Memory.DEVICE)
        print("NOT LOST")
        sys.exit(1)
    except Lost as e:
        print("LOST", e.reason)
    print("FACTS", d.facts.arch)
    # The RM's records of the compute context's MMU faults, asked again (a read clears
    # nothing): the access's evidence, or why the Fault has none.
    try:
        got = read_fault_records(d.path.rm, d.ffi, d.health.debuggee())
        print("RECORDS", [(hex(r.address), r.fault_type, r.access) for r in got])
    except RigError as e:
        print("REFUSED", e)
    vadd_cubin = sys.argv[3]
""") + REOPEN


def faulting_child(script: str, *args: str) -> list[str]:
    """Run a child that faults; its lines, having checked the two every child prints first:
    the Fault naming the RM's channel error, then Lost on the next use."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    print(out.stdout, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr[-2000:]
    assert lines[0].startswith("FAULT ROBUST_CHANNEL_") and "Xid" in lines[0]
    assert lines[1].startswith("LOST ")
    return lines


FAULTS = Path(__file__).resolve().parent / "cubins" / "faults.sm_90.cubin"


@pytest.mark.parametrize(("kernel", "access"), [("vadd", "read"), ("plain_store", "write")])
@pytest.mark.parametrize("address", [0xDEAD0000, 0x7F00_0000_0000], ids=["unmapped-low",
                                                                           "unmapped-high"])
def test_illegal_address_is_a_fault_and_the_gpu_opens_again(address: int, kernel: str,
                                                             access: str) -> None:
    """A kernel reaching 4 KiB at an address nothing is mapped at: vadd (kernels.cu) reads a and
    b there before it could write c (its store needs what it loads), plain_store (faults.cu)
    only writes. A Fault naming the channel error; where the RM reports the MMU fault's address
    (NV906F_CTRL_CMD_GET_MMU_FAULT_INFO for an Xid 31, rig_nv.faults) it lies in the page of
    that address (the MMU reports whole pages, every access lies in the first 4 KiB), and the
    access is the kernel's, as the RM recorded it for the compute context (a GT200_DEBUGGER's
    NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO); the device lost; the GPU opening again.

    Where the RM refuses the debugger or records no fault for the context, the test is an xfail
    naming the RM's answer, not a pass: the Fault then carries no access."""
    cubin = CUBIN if kernel == "vadd" else FAULTS
    lines = faulting_child(CHILD.format(address=address), str(cubin), kernel, str(CUBIN))
    error, reported, got, _engine = lines[0].removeprefix("FAULT ").rsplit(" | ", 3)
    if reported != "None":
        assert address <= int(reported) < address + 4096, (hex(int(reported)), hex(address))
        assert "(Xid 31)" in error, error  # only an MMU fault asks the RM for an address
    assert lines[2] == "FACTS sm_90"
    records = lines[3]
    assert records.startswith(("RECORDS ", "REFUSED ")), records
    assert lines[4] == "REOPENED True"
    print(f"ACCESS {got} (expected {access}); the RM's records: {records}")
    if got == "None":
        if reported == "None":
            pytest.xfail(f"the RM reported no MMU fault address, so no access was asked for "
                         f"({error}); {records}")
        if records.startswith("REFUSED "):
            pytest.xfail("the RM refused the GT200_DEBUGGER or its READ_MMU_FAULT_INFO: "
                         + records.removeprefix("REFUSED "))
        if records == "RECORDS []":
            pytest.xfail("the RM made the GT200_DEBUGGER but recorded no MMU fault for the "
                         "compute context (READ_MMU_FAULT_INFO count 0)")
    assert got == access, (got, records)


KIND_CHILD = textwrap.dedent("""
    import numpy as np, sys
    import rig_nv_nvidia
    from rig_edge import Fault, Lost, Memory, RigError
    from rig_nv.faults import read_sm_error_states
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(open(sys.argv[1], "rb").read())
    out = d.alloc(4096, Memory.DEVICE)
    try:
        d.launch(img[sys.argv[2]], (2,), (64,), (out,)).wait(timeout_s=60)
        print("NO FAULT")
        sys.exit(1)
    except Fault as e:
        print("FAULT", e.channel_error, "|", e.address, "|", e.pc, "|", e.engine, "|", out.gpu)
    try:
        d.upload(out, bytes(16))
        print("NOT LOST")
        sys.exit(1)
    except Lost as e:
        print("LOST", e.reason)
    # The RM's SM error states of the compute channel, asked again (a read clears nothing):
    # the error's evidence, or why the Fault has none.
    try:
        got = read_sm_error_states(d.path.rm, d.ffi, d.health.debuggee(), d.sm_count)
        shown = [(s.sm, hex(s.global_esr), hex(s.warp_esr), hex(s.pc), hex(s.esr_address),
                  hex(s.cga_esr), s.error) for s in got if s.global_esr or s.warp_esr or s.cga_esr]
        print("STATES", len(got), "SMs,", len(shown), "nonzero:", shown[:6])
    except RigError as e:
        print("REFUSED", e)
    vadd_cubin = sys.argv[3]
""") + REOPEN

# The error each kernel's SM should report (NV_PGRAPH_PRI_GPC0_TPC0_SM0_HWW_WARP_ESR_ERROR_* or the
# global register's bits, as rig_nv.faults names them): a trap (PTX trap, "abort execution and
# generate an interrupt to the host") and a breakpoint (PTX brkpt) are no warp errors but the
# SM's breakpoint interrupt; an instruction of all-ones bits is an illegal encoding (or
# parameter).
EXPECTED = {
    # With no debugger attached when they run, the H200 (580.159.04) reports a trap
    # (BPT.TRAP) and a breakpoint (BPT.INT) as warp ESR 0x10009, an illegal instruction
    # encoding, on the SMs that ran them (docs/results/sm-errors-2026-11-30.txt); a real
    # illegal instruction shows 0x9.
    "trap": ("ILLEGAL_INSTR",),
    "breakpoint": ("ILLEGAL_INSTR",),
    "misaligned": ("MISALIGNED_ADDR",),
    "plain_store": ("ILLEGAL_INSTR",),
}


def check_sm_error(kernel: str, lines: list[str]) -> None:
    """What the Fault says the SM reported, checked against the kernel's kind (EXPECTED); an
    xfail naming the RM's answer where it refused the debugger or recorded no SM error state."""
    error, address, pc, _engine, out = lines[0].removeprefix("FAULT ").rsplit(" | ", 4)
    assert "(Xid 13)" in error, error
    states = lines[2]
    assert states.startswith(("STATES ", "REFUSED ")), states
    name = error.partition(" on the compute channel: ")[2].rpartition(" (SM ")[0]
    print(f"SM ERROR {name or None} (expected {' or '.join(EXPECTED[kernel])}), address "
          f"{address}, pc {pc}; the RM's states: {states}")
    if not name:
        if states.startswith("REFUSED "):
            pytest.xfail("the RM refused the GT200_DEBUGGER or its READ_ALL_SM_ERROR_STATES: "
                         + states.removeprefix("REFUSED "))
        if " 0 nonzero" in states:
            pytest.xfail("no SM error state recorded: the RM made the GT200_DEBUGGER and "
                         f"answered READ_ALL_SM_ERROR_STATES with all ESRs zero ({states})")
    assert any(e in name for e in EXPECTED[kernel]), (name, states)
    if kernel == "misaligned" and address != "None":  # every thread stores at out + 1
        print(f"ADDRESS out + {int(address) - int(out):#x}")
        assert int(out) <= int(address) < int(out) + 4096, (hex(int(address)), hex(int(out)))


@pytest.mark.parametrize("kernel", ["trap", "misaligned", "breakpoint"])
def test_sm_exceptions_are_faults_and_the_gpu_opens_again(kernel: str) -> None:
    """A kernel that traps, makes a misaligned access or hits a breakpoint (cubins/faults.cu):
    wait raises Fault naming the RM's channel error and the error the SM reported (the RM's SM
    error states, NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES of a GT200_DEBUGGER made after
    the fault, rig_nv.faults), the device is lost, and after its stop the GPU opens again in the
    same process and computes right. Where the RM refuses the debugger or recorded no SM error
    state, an xfail naming its answer, not a pass."""
    lines = faulting_child(KIND_CHILD, str(FAULTS), kernel, str(CUBIN))
    assert lines[3] == "REOPENED True"
    check_sm_error(kernel, lines)


def illegal_instruction_cubin() -> bytes:
    """faults.sm_90.cubin with plain_store's first instruction overwritten by all-ones, an
    encoding no SM decodes (its section found through rig's own ELF reader)."""
    import struct as st

    from rig_nv.cubin import _Reader, _sections

    data = bytearray(FAULTS.read_bytes())
    r = _Reader(bytes(data))
    shoff, = st.unpack_from("<Q", data, 0x28)
    entsize, count, strndx = st.unpack_from("<HHH", data, 0x3A)
    (text,) = [s for s in _sections(r, shoff, entsize, count, strndx)
               if s.name == ".text.plain_store"]
    data[text.offset:text.offset + 16] = b"\xff" * 16
    return bytes(data)


def test_an_illegal_instruction_is_a_fault_and_the_gpu_opens_again(tmp_path: Path) -> None:
    """plain_store, harmless as built, with an undecodable first instruction: a Fault naming an
    illegal instruction as the SM reported it (as in the SM exceptions' test), the device lost,
    the GPU opening again. (Were the bytes some valid instruction, the kernel would end without
    a fault and the child says NO FAULT: the test fails.)"""
    patched = tmp_path / "illegal.cubin"
    patched.write_bytes(illegal_instruction_cubin())
    lines = faulting_child(KIND_CHILD, str(patched), "plain_store", str(CUBIN))
    assert lines[3] == "REOPENED True"
    check_sm_error("plain_store", lines)


HANG_CHILD = textwrap.dedent("""
    import ctypes, sys, time
    import numpy as np
    import rig_nv_nvidia
    from rig_edge import Fault, Lost, Memory
    d = rig_nv_nvidia.gpu(0).open()
    print("HANG_MS", d.facts.hang_ms)
    img = d.load(open(sys.argv[1], "rb").read())
    flag = d.alloc(4096, Memory.PINNED)
    word = ctypes.c_int.from_address(flag.host)
    word.value = 0
    start = time.monotonic()
    try:
        d.launch(img["spin"], (1,), (32,), (flag,)).wait(timeout_s=300)
        print("NOT GIVEN UP")
        sys.exit(1)
    except Fault as e:
        print("FAULT", e)
        sys.exit(1)
    except Lost as e:
        print("LOST", round(time.monotonic() - start), "|", e.reason)
    word.value = 1  # the spin kernel ends: the GPU recovers
    vadd_cubin = sys.argv[2]
""") + REOPEN


def test_a_kernel_without_progress_is_given_up_after_hang_ms() -> None:
    """Spec: on a GPU without a display hang_ms is 30 s; a kernel that spins is given up after
    30 s without progress (Lost naming why), the spin can be ended, the GPU opens again."""
    out = subprocess.run(
        [sys.executable, "-c", HANG_CHILD, str(FAULTS), str(CUBIN)], capture_output=True,
        text=True, timeout=400, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    print(out.stdout, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr[-2000:]
    if lines[0] == "HANG_MS None":
        pytest.skip("this GPU drives a display: the RM's watchdog, not hang_ms, ends such work")
    assert lines[0] == "HANG_MS 30000"
    seconds = int(lines[1].split()[1])
    assert lines[1].startswith("LOST ") and "no progress for 30 s" in lines[1]
    assert 30 <= seconds <= 60, seconds
    assert lines[2] == "REOPENED True"
