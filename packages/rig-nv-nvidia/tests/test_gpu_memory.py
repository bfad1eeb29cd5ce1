"""The kernel-driver path on a real GPU: opening, memory of each kind, copies, map_host,
usage, dma-buf. Random data every time, compared byte for byte."""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rig_nv_nvidia
from rig_edge import Memory, OpenRefused, Refusal
from rig_nv import Device

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


def random_bytes(n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def test_open_stop_open_again() -> None:
    """Spec: a device's stop lets the GPU be opened again."""
    d = rig_nv_nvidia.gpu(0).open()
    assert d.arch == "sm_90"
    assert d.facts.bus == rig_nv_nvidia.buses()[0]
    assert d.facts.hang_ms == 30_000  # no display on the H200: no RM watchdog
    d.stop()
    d.stop()  # a second stop does nothing
    again = rig_nv_nvidia.gpu(0).open()
    again.stop()


def test_second_open_while_live_is_refused(device: Device) -> None:
    """Spec: make is Error when a device of GPU i is open and not stopped."""
    with pytest.raises(OpenRefused, match="open and not stopped"):
        rig_nv_nvidia.gpu(0).open()


@pytest.mark.parametrize("kind", [Memory.DEVICE, Memory.PINNED, Memory.MAPPED])
@pytest.mark.parametrize("size", [4096, 64 << 20, 8 << 30])
def test_alloc_each_kind_and_size(device: Device, kind: Memory, size: int) -> None:
    """Pinned and Mapped lie at one address for host and GPU; Device has no host address."""
    r = device.alloc(size, kind)
    assert r is not None and r.length == size and r.kind is kind
    if kind is Memory.DEVICE:
        assert r.host is None
    else:
        assert r.host == r.gpu and (384 << 30) <= r.gpu < (1 << 40)
    # Prove the memory is there: random bytes at both ends go in and come back.
    part = min(4096, size // 2)
    head, tail = random_bytes(part), random_bytes(part)
    device.upload(r, head, 0)
    device.upload(r, tail, size - part).wait()
    assert bytes(device.download(r, part, 0)) == head
    assert bytes(device.download(r, part, size - part)) == tail
    device.free(r)


@pytest.mark.parametrize("n", [1, 3, 4097, (1 << 20) + 13, (96 << 20) + 7])
def test_copies_round_trip_odd_sizes_and_offsets(device: Device, n: int) -> None:
    src_off, dst_off = int(rng.integers(0, 4096)), int(rng.integers(0, 4096))
    data = random_bytes(n)
    dev_a = device.alloc(n + 8192, Memory.DEVICE)
    dev_b = device.alloc(n + 8192, Memory.DEVICE)
    pin = device.alloc(n + 8192, Memory.PINNED)
    assert dev_a and dev_b and pin
    device.upload(dev_a, data, src_off)  # host -> Device (staged)
    device.copy(dev_b, dev_a, n, dst_offset=dst_off, src_offset=src_off)  # Device -> Device
    device.copy(pin, dev_b, n, dst_offset=7, src_offset=dst_off).wait()  # Device -> Pinned
    assert bytes(device.download(dev_b, n, dst_off)) == data  # Device -> host
    assert bytes(device.download(pin, n, 7)) == data


def test_timeline_values_complete_in_order_across_queues(device: Device) -> None:
    a = device.alloc(64 << 20, Memory.DEVICE)
    b = device.alloc(64 << 20, Memory.PINNED)
    assert a and b
    points = [device.copy(b, a) for _ in range(20)]
    assert [p.value for p in points] == sorted(p.value for p in points)
    points[-1].wait()
    assert all(p.signaled for p in points)


def test_copies_run_on_an_async_copy_engine_in_a_group_of_their_own(device: Device) -> None:
    """rig_nv.engines / rig_nv.setup: the GPU reports asynchronous copy engines; the copy
    channel has a channel group of its own on the one chosen (no GRCE), and host, Device and
    Pinned copies run there. Prints the RM's copy engine table and UVM's picks."""
    from rig_nv import engines

    ces = engines.query(device.path)
    assert ces is not None
    for ce in ces:
        print(f"{ce}: caps {ce.caps.hex()} PCEs 0x{ce.pce_mask:x}"
              f"{' usable' if ce.usable else ''}")
    chosen = engines.choose(ces)
    print(f"UVM's picks {engines.pick(ces)}; rig's copies on {chosen}")
    assert chosen is not None and device.copy_engine == chosen.index
    assert device.objects.copy_tsg is not None and not chosen.has(engines.CE_GRCE)
    n = (8 << 20) + 5
    data = random_bytes(n)
    a, b, pin = (device.alloc(n, k) for k in (Memory.DEVICE, Memory.DEVICE, Memory.PINNED))
    assert a and b and pin
    device.upload(a, data)  # host -> Device, staged through pinned memory
    device.copy(b, a, engine="copy")
    device.copy(pin, b, engine="copy").wait()
    assert bytes(device.download(pin)) == data and bytes(device.download(b)) == data


def _gpu_copy_of_host(device: Device, region_bytes: int, host: object) -> bytes:
    mapped = device.map_host(host)
    assert not isinstance(mapped, Refusal), mapped
    dst = device.alloc(region_bytes, Memory.DEVICE)
    assert dst
    device.copy(dst, mapped, region_bytes).wait()
    out = bytes(device.download(dst))
    device.free(mapped)
    return out


def test_map_host_anonymous_memory(device: Device) -> None:
    buf = bytearray(random_bytes(3 * 4096 + 100))
    assert _gpu_copy_of_host(device, len(buf), buf) == bytes(buf)


def test_map_host_tmpfs_shared_file(device: Device) -> None:
    """tmpfs tracks no dirty pages: Linux pins its shared mappings for the long term."""
    with tempfile.TemporaryFile(dir="/dev/shm") as f:
        data = random_bytes(1 << 20)
        f.write(data)
        f.flush()
        m = mmap.mmap(f.fileno(), len(data), mmap.MAP_SHARED)
        try:
            assert _gpu_copy_of_host(device, len(data), m) == data
        finally:
            m.close()


def _ext4_dir() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        _, where, fs = line.split()[:3]
        if fs == "ext4" and os.access(where, os.W_OK):
            return Path(where)
    return None


def test_map_host_ext4_shared_file_is_never(device: Device) -> None:
    """Spec: from Linux 6.5 a long-term pin of a shared file mapping on ext4 is refused, so
    map_host answers Never for those pages."""
    where = _ext4_dir()
    if where is None:
        pytest.skip("no writable ext4 mount on this machine")
    with tempfile.TemporaryFile(dir=where) as f:
        f.write(random_bytes(1 << 16))
        f.flush()
        m = mmap.mmap(f.fileno(), 1 << 16, mmap.MAP_SHARED)
        try:
            assert device.map_host(m) is Refusal.NEVER
        finally:
            m.close()


def test_usage_sees_memory_and_busy(device: Device) -> None:
    """usage: memory_free drops by what is allocated; busy > 0 while copies run."""
    before = rig_nv_nvidia.usage(0, window=1.0)
    assert before.memory_total > 100 << 30
    big = device.alloc(8 << 30, Memory.DEVICE)
    assert big
    after = rig_nv_nvidia.usage(0, window=1.0)
    assert before.memory_free - after.memory_free >= (8 << 30) - (64 << 20)
    other = device.alloc(8 << 30, Memory.DEVICE)
    assert other
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            device.copy(other, big).wait()

    t = threading.Thread(target=churn)
    t.start()
    try:
        time.sleep(2.5)
        busy = rig_nv_nvidia.usage(0, window=2.0).busy
    finally:
        stop.set()
        t.join()
    assert busy is not None and busy > 0


def test_dma_buf_export_has_the_objects_size(device: Device) -> None:
    r = device.alloc(64 << 20, Memory.DEVICE)
    assert r
    buf = device.dma(r)
    try:
        assert buf.offset == 0 and buf.length == 64 << 20
        assert os.lseek(buf.fd, 0, os.SEEK_END) == 64 << 20
    finally:
        os.close(buf.fd)


@pytest.mark.parametrize(("dst_off", "src_off", "n"), [
    (0, 0, 64 << 20),  # 16-byte vectors only
    (16, 48, (64 << 20) + 5),  # vectors, then 5 bytes
    (32, 16, (3 << 20) + 4096 + 48),  # a grid rounded up (200 blocks for 193 chunks)
    (3, 1, (32 << 20) + 1),  # unaligned: byte by byte
    (16, 0, 4096 + 7), (0, 5, 3),  # small copies run on the SMs too
])
def test_copies_inside_the_gpu_run_on_the_sms(device: Device, dst_off: int, src_off: int,
                                              n: int) -> None:
    """Copies between video memory, of any size, use rig's copy kernels (issue 23: one block
    a chunk): the destination gets the bytes, and the bytes around it stay."""
    data = random_bytes(n)
    a = device.alloc(n + 64, Memory.DEVICE)
    b = device.alloc(n + 64, Memory.MAPPED)
    assert a and b
    guard = random_bytes(64)
    if dst_off:
        device.upload(b, guard[:dst_off], 0)
    device.upload(b, guard[dst_off:], dst_off + n)
    device.upload(a, data, src_off)
    device.loader.copy_kernels()  # loaded first: a load uploads the code on the copy channel
    put = device.copy_channel.put
    device.copy(b, a, n, dst_offset=dst_off, src_offset=src_off).wait()
    assert device.copy_channel.put == put  # the SMs copied, not the copy engine
    assert bytes(device.download(b, n, dst_off)) == data
    if dst_off:
        assert bytes(device.download(b, dst_off, 0)) == guard[:dst_off]
    assert bytes(device.download(b, 64 - dst_off, dst_off + n)) == guard[dst_off:]


def test_freed_device_memory_is_reused_and_trimmed(device: Device) -> None:
    a = device.alloc(64 << 10, Memory.DEVICE)
    assert a
    device.free(a)
    device.synchronize()
    b = device.alloc(64 << 10, Memory.DEVICE)
    assert b and b.gpu == a.gpu  # the same memory, kept by free
    data = random_bytes(64 << 10)
    device.upload(b, data).wait()
    assert bytes(device.download(b)) == data
    device.free(b)
    device.trim()
    c = device.alloc(8 << 30, Memory.DEVICE)
    assert c
    device.free(c)  # within cache_limit (a quarter of the budget): kept, as CuPy's pool does
    assert [a.gpu for a in device.memory.kept()] == [c.gpu]
    before = rig_nv_nvidia.usage(0).memory_free
    device.cache_limit = 4 << 30  # below it: given back to the RM at once
    assert device.memory.kept() == []
    assert rig_nv_nvidia.usage(0).memory_free - before >= (8 << 30) - (64 << 20)
