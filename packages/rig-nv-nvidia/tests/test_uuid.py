"""rig_nv_nvidia.uuid: a GPU's UUID from the RM, as nvidia-smi prints it (issue 22, trip 5:
`rig list` gains a UUID column). The RM's answer is checked on a GPU in rig-cli's test_gpu."""

import pytest

import rig_nv_nvidia
from rig_edge import Misuse, OpenRefused, RigError
from rig_nv_nvidia.opener import uuid_text


def test_the_rm_s_sixteen_bytes_print_as_nvidia_smi_prints_them() -> None:
    assert uuid_text(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


def test_a_negative_index_is_misuse_and_a_missing_gpu_an_error() -> None:
    """uuid opens nothing, so a GPU the machine lacks is a plain RigError, as usage's is
    (issue 20 item 7), never an OpenRefused."""
    with pytest.raises(Misuse):
        rig_nv_nvidia.uuid(-1)
    with pytest.raises(RigError, match="has no GPU 99") as e:
        rig_nv_nvidia.uuid(99)
    assert not isinstance(e.value, OpenRefused)
