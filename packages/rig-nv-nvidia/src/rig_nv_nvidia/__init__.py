"""rig-nv-nvidia: NVIDIA GPUs of this machine, opened through NVIDIA's kernel driver.

The resource manager (RM) is reached by ioctls on /dev/nvidiactl and /dev/nvidiaN, and GPU
memory is mapped into the GPU's address space through /dev/nvidia-uvm. No CUDA library.

    import rig_nv_nvidia
    d = rig_nv_nvidia.gpu(0).open()
    print(d.arch)          # "sm_90" on an H200
"""

from rig_nv_nvidia.listing import buses, count
from rig_nv_nvidia.opener import Usage, gpu, reaches, usage, uuid

__version__ = "0.1.0"

__all__ = ["Usage", "__version__", "buses", "count", "gpu", "reaches", "usage", "uuid"]
