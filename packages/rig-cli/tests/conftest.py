"""Fixtures the rig-cli tests share: ``sshd``, a real SSH server on 127.0.0.1 (rig-pci's
tests/ssh_server.py)."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parents[2] / "rig-pci/tests"))
from ssh_server import sshd  # noqa: F401  (the fixture)
