"""rig_nv_pci.boot.fsp against the simulated FSP (tests/sim/fsp.py)."""

from __future__ import annotations

import struct

import pytest
import sim

from rig_edge import Misuse
from rig_nv_pci.boot import fsp
from rig_nv_pci.boot.fsp import Fsp, FspError

GPU = "GPU 0 (0000:41:00.0)"

# NVDM_PAYLOAD_COT as src/nvidia/inc/kernel/gpu/fsp/kern_fsp_cot_payload.h declares it
# (#pragma pack(1), open-gpu-kernel-modules 570.144): field, C type, count. The offsets below are
# summed by hand from it: 2+2+8+8+4+8+4+48+384+384+8 = 860.
COT_HEADER = [("version", "NvU16", 1), ("size", "NvU16", 1), ("gspFmcSysmemOffset", "NvU64", 1),
              ("frtsSysmemOffset", "NvU64", 1), ("frtsSysmemSize", "NvU32", 1),
              ("frtsVidmemOffset", "NvU64", 1), ("frtsVidmemSize", "NvU32", 1),
              ("hash384", "NvU32", 12), ("publicKey", "NvU32", 96), ("signature", "NvU32", 96),
              ("gspBootArgsSysmemOffset", "NvU64", 1)]
COT_OFFSETS = {"version": 0, "size": 2, "gspFmcSysmemOffset": 4, "frtsSysmemOffset": 12,
               "frtsSysmemSize": 20, "frtsVidmemOffset": 24, "frtsVidmemSize": 32,
               "hash384": 36, "publicKey": 84, "signature": 468, "gspBootArgsSysmemOffset": 852}

HASH = bytes(range(48))
PKEY = bytes((i * 7) & 0xFF for i in range(384))
SIG = bytes((i * 13 + 5) & 0xFF for i in range(384))


def _cot(**kw: object) -> bytes:
    args: dict[str, object] = {
        "fmc_address": 0x1_2345_6000, "boot_params_address": 0x1_2346_0000, "hash384": HASH,
        "public_key": PKEY, "signature": SIG, "frts_vidmem_offset": 0x400000,
        "frts_sysmem_address": 0x1_2400_0000, "frts_sysmem_size": 0x100000}
    args.update(kw)
    return fsp.cot_payload(**args)  # type: ignore[arg-type]


def _rig(**kw: object) -> tuple[sim.SimGpu, sim.SimFsp, Fsp]:
    model = sim.SimFsp(**kw)  # type: ignore[arg-type]
    gpu = sim.SimGpu(fsp=model)
    return gpu, model, Fsp(gpu.bar0(), GPU, timeout_s=0.05)


def test_the_cot_payload_is_860_bytes_with_the_headers_offsets() -> None:
    sizes = {"NvU16": 2, "NvU32": 4, "NvU64": 8}
    at = 0
    for name, ctype, count in COT_HEADER:
        assert COT_OFFSETS[name] == at, name
        at += sizes[ctype] * count
    assert at == 860 == fsp.COT_SIZE == struct.calcsize(fsp.COT_FORMAT)
    p = _cot(frts_vidmem_size=0x100000)
    assert len(p) == 860

    def u(name: str, fmt: str) -> int:
        return int(struct.unpack_from(fmt, p, COT_OFFSETS[name])[0])

    assert u("version", "<H") == 1 and u("size", "<H") == 860
    assert u("gspFmcSysmemOffset", "<Q") == 0x1_2345_6000
    assert u("frtsSysmemOffset", "<Q") == 0x1_2400_0000
    assert u("frtsSysmemSize", "<I") == 0x100000
    assert u("frtsVidmemOffset", "<Q") == 0x400000
    assert u("frtsVidmemSize", "<I") == 0x100000
    assert p[36:84] == HASH and p[84:468] == PKEY and p[468:852] == SIG
    assert u("gspBootArgsSysmemOffset", "<Q") == 0x1_2346_0000
    # the simulator's own table agrees
    assert {n: o for n, (o, _) in sim.fsp.COT_FIELDS.items()} == COT_OFFSETS


def test_cot_version_2_pads_blackwells_key_and_signature() -> None:
    p = _cot(version=2, public_key=b"\x11" * 97, signature=b"\x22" * 96)
    assert struct.unpack_from("<HH", p) == (2, 860)
    assert p[84:84 + 97] == b"\x11" * 97 and p[84 + 97:468] == bytes(384 - 97)
    assert p[468:468 + 96] == b"\x22" * 96 and p[468 + 96:852] == bytes(384 - 96)


@pytest.mark.parametrize(("kw", "named"), [
    ({"hash384": HASH[:47]}, "hash384 is 47 bytes, not 48"),
    ({"public_key": PKEY + b"\0"}, "public_key is 385 bytes, not 384"),
    ({"signature": SIG[:96]}, "signature is 96 bytes, not 384"),
    ({"version": 2}, "public_key is 384 bytes, not 97"),
    ({"version": 3}, "version 3"),
    ({"frts_vidmem_size": 1 << 32}, "frts_vidmem_size"),
    ({"fmc_address": -1}, "fmc_address"),
])
def test_bad_cot_fields_are_refused_naming_the_field(kw: dict[str, object], named: str) -> None:
    with pytest.raises(Misuse, match=named):
        _cot(**kw)


def test_a_bad_payload_is_refused_before_any_register_is_touched() -> None:
    gpu, model, f = _rig()
    with pytest.raises(Misuse, match="859"):
        f.send_cot(_cot()[:859])
    bad = bytearray(_cot())
    bad[0] = 7
    with pytest.raises(Misuse, match="version 7"):
        f.send_cot(bytes(bad))
    with pytest.raises(Misuse, match="one packet"):
        f.command(0x16, bytes(1020))
    with pytest.raises(Misuse, match="hash384"):
        f.send_cot(_cot(hash384=b""))
    assert gpu.writes == [] and gpu.reads == [] and model.packets == []


def test_emem_round_trip_with_auto_increment() -> None:
    gpu, model, f = _rig()
    data = bytes(range(256)) * 2 + b"tail"
    f.emem_write(0x1F8, data)  # crosses from block 1 into blocks 2 and 3
    assert model.emem[0x1F8:0x1F8 + len(data)] == data
    assert model.ememc & 0xFFFF == 0x1F8 + len(data)
    assert f.emem_read(0x1F8, len(data)) == data
    assert (sim.regs.FSP_EMEMC, 0x1F8 | 1 << 24) in gpu.writes
    assert (sim.regs.FSP_EMEMC, 0x1F8 | 1 << 25) in gpu.writes
    with pytest.raises(Misuse, match="whole dwords"):
        f.emem_write(0x3FC, bytes(8))


def test_a_cot_message_is_sent_and_answered() -> None:
    gpu, model, f = _rig(task_id=3)
    payload = _cot()
    f.wait_ready()
    reply = f.send_cot(payload)
    assert reply == fsp.FspResponse(task_id=3, command=0x14, error_code=0)
    assert model.received == [(0x14, payload)]
    (packet,) = model.packets
    assert len(packet) == 868
    assert struct.unpack_from("<II", packet) == (0xC0000000, 0x1410DE7E)
    assert packet[8:] == payload
    assert sim.fsp.cot_field(packet[8:], "hash384") == HASH
    # TAIL (the last dword, 864) before HEAD (the doorbell); the answer acknowledged
    writes = [(o, v) for o, v in gpu.writes if o in (sim.regs.FSP_QUEUE_TAIL,
                                                     sim.regs.FSP_QUEUE_HEAD)]
    assert writes == [(sim.regs.FSP_QUEUE_TAIL, 864), (sim.regs.FSP_QUEUE_HEAD, 0)]
    assert model.msgq_head == model.msgq_tail
    assert model.queue_head == model.queue_tail
    f.send_cot(payload)  # the queues are free for another
    assert len(model.received) == 2


def test_an_fsp_error_code_raises_naming_the_gpu_command_and_code() -> None:
    _, model, f = _rig(error_code=0x9F)
    with pytest.raises(FspError, match=r"GPU 0 \(0000:41:00\.0\): the FSP refused the COT "
                                       r"\(0x14\) command with error code 0x9f "
                                       r"\(FSP_ERR_IFR_FILE_NOT_FOUND\)"):
        f.send_cot(_cot())
    assert model.received[0][0] == 0x14


def test_a_payload_the_fsp_rejects_comes_back_as_its_error() -> None:
    _, model, f = _rig(cot_version=2)
    with pytest.raises(FspError, match=r"error code 0xa1 \(FSP_ERR_IFS_ERR_INVALID_DATA\)"):
        f.send_cot(_cot())
    assert model.received == [] and "COT version 1" in model.log[0]


def test_an_fsp_that_never_answers_times_out_naming_the_gpu() -> None:
    _, model, f = _rig(answer=False)
    with pytest.raises(FspError, match=r"GPU 0 \(0000:41:00\.0\): the FSP did not answer the "
                                       r"COT \(0x14\) command within 0\.05 s .*MSGQ_HEAD"):
        f.send_cot(_cot())
    assert len(model.packets) == 1


def test_a_busy_command_queue_times_out() -> None:
    _, model, f = _rig()
    model.queue_tail = 0x10  # the FSP never consumes
    with pytest.raises(FspError, match=r"command queue did not empty within 0\.05 s"):
        f.send_cot(_cot())
    assert model.packets == []


def test_a_message_while_waiting_to_send_fails() -> None:
    _, model, f = _rig()
    model.post(struct.pack("<5I", 0xC0000000, 0x1510DE7E, 0, 0x20, 0))
    with pytest.raises(FspError, match=r"sent a message .* while the COT"):
        f.send_cot(_cot())
    assert model.packets == []


def test_the_fsp_ready_wait() -> None:
    _, model, f = _rig(boot_polls=3)
    f.wait_ready(timeout_s=1.0)
    assert model.boot_polls == 0


def test_an_fsp_never_ready_times_out() -> None:
    _, _, f = _rig(boot_polls=None)
    with pytest.raises(FspError, match=r"GPU 0 \(0000:41:00\.0\): the FSP did not finish its "
                                       r"boot within 0\.02 s \(NV_THERM_I2CS_SCRATCH "
                                       r"0x00000000.*SCRATCH_GROUP_2\(3\)"):
        f.wait_ready(timeout_s=0.02)


def test_the_headers() -> None:
    assert fsp.mctp_header(som=True, eom=True) == 0xC0000000
    assert fsp.mctp_header(som=False, eom=False, seq=5, seid=2) == 0x10020000
    assert fsp.nvdm_header(fsp.NVDM_TYPE_COT) == 0x1410DE7E
    assert fsp.nvdm_header(fsp.NVDM_TYPE_FSP_RESPONSE) == 0x1510DE7E


def test_an_answer_to_another_command_is_refused() -> None:
    _, model, f = _rig()
    model.reply = lambda nvdm_type, code: model.response(0x16, 0)
    with pytest.raises(FspError, match=r"answered CAPS_QUERY \(0x16\), not the COT \(0x14\)"):
        f.send_cot(_cot())


def test_an_answer_that_is_not_an_fsp_response_is_refused() -> None:
    _, model, f = _rig()
    model.reply = lambda nvdm_type, code: struct.pack("<5I", 0xC0000000, 0x1810DE7E, 0,
                                                      nvdm_type, code)
    with pytest.raises(FspError, match=r"not an NVDM FSP_RESPONSE \(message header 0x1810de7e"):
        f.send_cot(_cot())
