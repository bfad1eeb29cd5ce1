"""Running the real ``rig`` command from tests: a subprocess of this interpreter, with this
process's import path, no terminal on stdin, and a timeout."""

from __future__ import annotations

import os
import subprocess
import sys


def rig(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``rig ARGS...`` as a new process; its exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "rig_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
