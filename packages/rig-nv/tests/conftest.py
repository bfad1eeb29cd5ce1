"""The stand-in GPU path (fake_gpu.py) is importable by the tests beside it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
