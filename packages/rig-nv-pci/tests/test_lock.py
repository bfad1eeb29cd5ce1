"""rig_nv_pci.lock's place: one directory for root and every user (issue 20 item 10)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rig_nv_pci import lock
from rig_pci import locks

DIRECTORY = lock.directory  # the module's own rule (conftest's private_locks replaces it)


@pytest.mark.parametrize(("mode", "where"), [(0o1777, "run-lock"), (0o755, "tmp")])
def test_root_and_every_user_lock_in_one_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               mode: int, where: str) -> None:
    """Issue 20 item 10: root and a user took their locks in different directories (/run/lock
    where the process could write, else $XDG_RUNTIME_DIR or $TMPDIR), so their opens did not
    exclude each other. Now /run/lock where every user may write it, else /tmp, whoever asks
    and whatever the environment."""
    run, tmp = tmp_path / "run-lock", tmp_path / "tmp"
    run.mkdir()
    tmp.mkdir()
    run.chmod(mode)
    monkeypatch.setattr(locks, "RUN_LOCK", run)
    monkeypatch.setattr(locks, "TMP", tmp)
    as_root = DIRECTORY()
    assert as_root == tmp_path / where
    # a user: /run/lock not writable by this process, a runtime directory and TMPDIR of its own
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert DIRECTORY() == as_root
