"""Kernels on a real GPU (Hopper: QMD V04, HOPPER_COMPUTE_A): fresh random data every time,
compared with numpy."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest

from rig_edge import Memory, Region
from rig_nv import Device
from rig_nv.cubin import CubinError

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


CUBINS = Path(__file__).resolve().parents[2] / "rig-nv" / "tests" / "cubins"


def cubin(arch: str = "sm_90") -> bytes:
    return (CUBINS / f"kernels.{arch}.cubin").read_bytes()


def put(device: Device, array: np.ndarray) -> Region:
    r = device.alloc(array.nbytes, Memory.DEVICE)
    assert r is not None
    device.upload(r, array.tobytes())
    return r


def get(device: Device, r: Region, dtype: type, count: int) -> np.ndarray:
    return np.frombuffer(bytes(device.download(r, count * np.dtype(dtype).itemsize)), dtype=dtype)


N = 1 << 26


def test_vector_add_2_pow_26(device: Device) -> None:
    img = device.load(cubin())
    a, b = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
    ra, rb = put(device, a), put(device, b)
    rc = device.alloc(4 * N, Memory.DEVICE)
    assert rc
    device.launch(img["vadd"], (N // 256,), (256,), (ra, rb, rc, N)).wait()
    np.testing.assert_array_equal(get(device, rc, np.float32, N), a + b)


def test_saxpy_2_pow_26(device: Device) -> None:
    img = device.load(cubin())
    x, y = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
    alpha = float(np.float32(rng.random()))
    rx, ry = put(device, x), put(device, y)
    device.launch(img["saxpy"], ((N + 255) // 256,), (256,), (alpha, rx, ry, N)).wait()
    np.testing.assert_allclose(get(device, ry, np.float32, N), np.float32(alpha) * x + y,
                               rtol=1e-6)


@pytest.mark.parametrize("total_kib", [48, 200])
def test_reduction_static_and_dynamic_shared(device: Device, total_kib: int) -> None:
    """47 KiB static shared memory plus dynamic shared memory up to 48 KiB and 200 KiB."""
    img = device.load(cubin())
    n, blocks, threads = 1 << 22, 128, 256
    dynamic = total_kib * 1024 - 47 * 1024
    data = rng.random(n, dtype=np.float32)
    rin = put(device, data)
    rout = device.alloc(4 * blocks, Memory.DEVICE)
    assert rout
    device.upload(rout, bytes(4 * blocks))
    device.launch(img["reduce"], (blocks,), (threads,), (rin, rout, n), shared=dynamic).wait()
    got = get(device, rout, np.float32, blocks).astype(np.float64)
    # The same tree on the host: block b's thread t sums elements i with i // threads % blocks
    # == b and i % threads == t; each step adds the partner's partial sum and half of its
    # first sum (extra[] = s / 2); thread 0 adds the 1.0 it put at the far end of the array.
    per_thread = np.zeros((blocks, threads))
    idx = np.arange(n)
    np.add.at(per_thread, ((idx // threads) % blocks, idx % threads), data)
    stage, extra = per_thread.copy(), per_thread * 0.5
    w = threads // 2
    while w > 0:
        stage[:, :w] += stage[:, w : 2 * w] + extra[:, w : 2 * w]
        w //= 2
    np.testing.assert_allclose(got, stage[:, 0] + 1.0, rtol=1e-4)


def test_local_memory_kernel(device: Device) -> None:
    img = device.load(cubin())
    n = 1 << 16
    inp = rng.random(32, dtype=np.float32)
    idx = rng.integers(0, 1 << 30, 2 * n, dtype=np.int32)
    rin, ridx = put(device, inp), put(device, idx)
    rout = device.alloc(4 * n, Memory.DEVICE)
    assert rout
    device.launch(img["local_array"], (n // 128,), (128,), (rin, ridx, rout, n)).wait()
    i = np.arange(n, dtype=np.float32)
    buf = inp[None, :] * i[:, None]
    buf[np.arange(n), idx[:n] & 31] += 1.0
    np.testing.assert_array_equal(get(device, rout, np.float32, n), buf[np.arange(n), idx[n:] & 31])


def test_3d_grid(device: Device) -> None:
    img = device.load(cubin())
    nx, ny, nz = 67, 45, 23
    rout = device.alloc(4 * nx * ny * nz, Memory.DEVICE)
    assert rout
    device.launch(img["grid3d"], ((nx + 7) // 8, (ny + 3) // 4, (nz + 1) // 2), (8, 4, 2),
                  (rout, nx, ny, nz)).wait()
    got = get(device, rout, np.float32, nx * ny * nz).reshape(nz, ny, nx)
    # taps[] (a __constant__ array) is zero-initialised in the image: every output is 0 * s.
    assert np.all(got == 0.0)
    assert img.globals is not None
    visits = struct.unpack("<I", bytes(device.download(img.globals, 4)))[0]
    assert visits == nx * ny * nz
    # taps[] is a __constant__ bank the image binds for every kernel: write it, run again.
    taps = rng.random(8, dtype=np.float32)
    off, size = img.cubin.constants[3]
    assert size == 32
    device.upload(img.code, taps.tobytes(), off)
    device.launch(img["grid3d"], ((nx + 7) // 8, (ny + 3) // 4, (nz + 1) // 2), (8, 4, 2),
                  (rout, nx, ny, nz)).wait()
    z, y, x = np.meshgrid(np.arange(nz), np.arange(ny), np.arange(nx), indexing="ij")
    s = x + y + z
    np.testing.assert_array_equal(get(device, rout, np.float32, nx * ny * nz).reshape(nz, ny, nx),
                                  taps[s & 7] * s.astype(np.float32))


def test_struct_by_value(device: Device) -> None:
    img = device.load(cubin())
    m = rng.random(12, dtype=np.float32)
    n, stride, tag, flag = 500, 3, int(rng.integers(0, 1 << 40)), 5
    block = m.tobytes() + struct.pack("<iiQ", n, stride, tag)
    assert len(block) == 64
    rout = device.alloc(4 * n * stride, Memory.DEVICE)
    assert rout
    device.upload(rout, bytes(4 * n * stride))
    device.launch(img["by_value"], (2,), (256,), (block, rout, flag)).wait()
    got = get(device, rout, np.float32, n * stride)[::stride]
    want = m[np.arange(n) % 12] + np.float32(tag & 0xFF) + np.float32(flag)
    np.testing.assert_array_equal(got, want)


def test_ten_thousand_launches(device: Device) -> None:
    img = device.load(cubin())
    n = 1024
    x = rng.random(n, dtype=np.float32)
    y = np.zeros(n, dtype=np.float32)
    rx, ry = put(device, x), put(device, y)
    t = time.perf_counter()
    for _ in range(10_000):
        p = device.launch(img["saxpy"], (n // 256,), (256,), (1.0, rx, ry, n))
    p.wait()
    elapsed = time.perf_counter() - t
    got = get(device, ry, np.float32, n)
    want = np.zeros(n, dtype=np.float32)
    for _ in range(10_000):
        want = x + want
    np.testing.assert_allclose(got, want, rtol=1e-5)
    print(f"10,000 launches: {elapsed / 10_000 * 1e6:.2f} us each")


def test_step_of_64_dependent_launches_replayed_1000_times(device: Device) -> None:
    """A step: 64 saxpy launches, each reading what the previous wrote, replayed 1,000 times;
    the per-replay cost and the cost of each further kernel are printed."""
    img = device.load(cubin())
    n = 4096
    x = rng.random(n, dtype=np.float32)
    rx, ry = put(device, x), put(device, np.zeros(n, dtype=np.float32))
    step = device.step()
    for _ in range(64):
        step.launch(img["saxpy"], (n // 256,), (256,), (1.0, rx, ry, n))
    one = device.step()
    one.launch(img["saxpy"], (n // 256,), (256,), (1.0, rx, ry, n))
    step.submit().wait()
    one.submit().wait()
    t = time.perf_counter()
    for _ in range(1000):
        step.submit().wait()
    t64 = (time.perf_counter() - t) / 1000
    t = time.perf_counter()
    for _ in range(1000):
        one.submit().wait()
    t1 = (time.perf_counter() - t) / 1000
    got = get(device, ry, np.float32, n)
    want = np.zeros(n, dtype=np.float32)
    for _ in range(64 * 1001 + 1001):  # fma(1, x, y) rounds like x + y in float32
        want += x
    np.testing.assert_array_equal(got, want)
    print(f"step of 64: {t64 * 1e6:.1f} us per replay; one: {t1 * 1e6:.1f} us; "
          f"{(t64 - t1) / 63 * 1e6:.2f} us per further kernel")


def test_step_arguments_update_between_submissions(device: Device) -> None:
    img = device.load(cubin())
    n = 1024
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    ra, rb = put(device, a), put(device, b)
    out1 = device.alloc(4 * n, Memory.DEVICE)
    out2 = device.alloc(4 * n, Memory.DEVICE)
    assert out1 and out2
    step = device.step()
    i = step.launch(img["vadd"], (n // 256,), (256,), (ra, rb, out1, n))
    step.submit().wait()
    step.set_args(i, (ra, ra, out2, n))
    step.submit().wait()
    np.testing.assert_array_equal(get(device, out1, np.float32, n), a + b)
    np.testing.assert_array_equal(get(device, out2, np.float32, n), a + a)


@pytest.mark.parametrize("copied", [True, False], ids=["copied", "waited"])
def test_steps_between_copies_each_one_gpfifo_entry_in_order(
        device: Device, copied: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 5 ("Steps"): "submit the step many times, each submission one GPFIFO entry".
    200 rounds sent with no wait between: a copy of the round's fresh data into x on the copy
    channel, the step (y = x + x) on the compute channel, a copy of y into the round's own
    slot on the copy channel. Each step is one entry, which waits for the copy before it; each
    slot must hold twice its round's data. "copied": the step's wait and commands go through
    the pushbuffer; "waited": as for a step too large for that, the CPU waits for the copy
    instead and the entry names the step's own memory."""
    from rig_nv import timeline as timeline_module  # Timeline.submit_step reads it there

    if not copied:
        monkeypatch.setattr(timeline_module, "PUSHBUFFER_SHARE", 1 << 40)
    img = device.load(cubin())
    n, rounds = 1 << 16, 200
    data = rng.random(n * rounds, dtype=np.float32)
    src = device.alloc(data.nbytes, Memory.PINNED)
    out = device.alloc(data.nbytes, Memory.PINNED)
    rx, ry = device.alloc(4 * n, Memory.DEVICE), device.alloc(4 * n, Memory.DEVICE)
    assert src and out and rx and ry
    device.upload(src, data.tobytes())
    step = device.step()
    step.launch(img["vadd"], (n // 256,), (256,), (rx, rx, ry, n))
    compute, copy = device.compute, device.copy_channel
    for i in range(rounds):
        device.copy(rx, src, 4 * n, src_offset=4 * n * i)
        puts = compute.put, copy.put
        step.submit()
        assert (compute.put - puts[0], copy.put - puts[1]) == (1, 0)
        device.copy(out, ry, 4 * n, dst_offset=4 * n * i)
    got = np.frombuffer(bytes(device.download(out)), dtype=np.float32)
    np.testing.assert_array_equal(got, data + data)


def test_cubin_of_another_architecture_is_refused(device: Device) -> None:
    with pytest.raises(CubinError, match=r"sm_120.*sm_90"):
        device.load(cubin("sm_120"))


def test_profile_times_launches_copies_and_steps(device: Device, tmp_path: Path) -> None:
    """GPU timestamps around a launch, a copy and a step, and a Chrome trace of them."""
    import json

    img = device.load(cubin())
    a, b = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
    ra, rb = put(device, a), put(device, b)
    rc = device.alloc(4 * N, Memory.DEVICE)
    assert rc
    step = device.step()
    step.launch(img["vadd"], (N // 256,), (256,), (ra, rb, rc, N))
    with device.profile() as prof:
        device.launch(img["vadd"], (N // 256,), (256,), (ra, rb, rc, N))
        device.copy(rb, ra)
        step.submit()
    events = prof.events()
    assert [e.name for e in events] == ["vadd", "copy", "step"]
    assert all(0 < e.duration_ns < 1_000_000_000 for e in events)
    assert events[0].end_ns <= events[1].start_ns <= events[1].end_ns <= events[2].start_ns
    trace = prof.chrome_trace(tmp_path / "trace.json")
    assert len(json.loads((tmp_path / "trace.json").read_text())["traceEvents"]) == 3
    print("profile:", [(e.name, e.duration_ns) for e in events], trace["otherData"])
    # In order: vadd made a + b, the copy put a into rb, the step's vadd made a + a.
    np.testing.assert_array_equal(get(device, rb, np.float32, N), a)
    np.testing.assert_array_equal(get(device, rc, np.float32, N), a + a)
