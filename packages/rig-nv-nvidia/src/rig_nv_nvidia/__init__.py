"""rig-nv-nvidia: NVIDIA GPUs of this machine, opened through NVIDIA's kernel driver.

The resource manager (RM) is reached by ioctls on /dev/nvidiactl and /dev/nvidiaN, and GPU
memory is mapped into the GPU's address space through /dev/nvidia-uvm. No CUDA library.
"""

from rig_nv_nvidia.listing import buses, count

__version__ = "0.1.0"

__all__ = ["__version__", "buses", "count"]
