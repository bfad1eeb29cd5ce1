"""Fixtures the rig-cli tests share: ``sshd``, a real SSH server on 127.0.0.1 (rig-pci's
tests/ssh_server.py)."""

from ssh_server import sshd  # noqa: F401  (the fixture)
