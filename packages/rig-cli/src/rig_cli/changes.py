"""``rig detach|attach|reset i`` and ``rig firmware nv [DIR]``: changes to the machine.

These call the spec's ``Rig_nv_pci.detach/attach/reset``, which ``rig_nv_pci`` exports by GPU
index, and ``rig_pci.firmware.fetch``. They are found by name at run time, so that an install
lacking them says so (exit 4, "not available in this release") rather than failing to import.
Detach, attach and reset ask first (``--yes`` skips the question; with no terminal to ask on
they refuse rather than guess).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from rig_cli.chips import chip, is_gpu
from rig_edge import Misuse, RigError
from rig_pci import FunctionInfo, Machine

OK, FAILURE = 0, 1

# Where each operation lives: (module, name, what it takes). The spec's functions (rig_nv_pci)
# take the GPU's index; rig_pci.firmware.fetch the directory (and a mirror).
CANDIDATES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "detach": (("rig_nv_pci", "detach", "index"),),
    "attach": (("rig_nv_pci", "attach", "index"),),
    "reset": (("rig_nv_pci", "reset", "index"),),
    "firmware": (("rig_pci.firmware", "fetch", "dir"),),
}


class NotBuilt(RigError):
    """The installed release has no implementation of a change (exit 4, refused)."""


class NoSuchGpu(RigError):
    """The machine has no GPU of the index given (exit 3)."""


def find(operation: str) -> tuple[str, Callable[..., Any], str] | None:
    """(``module.name``, the function, what it takes) of the first candidate that exists."""
    for module, name, takes in CANDIDATES[operation]:
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as e:
            # Only the module's own absence means "not built"; a module that exists and fails
            # to import is a bug to show, not to hide.
            if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
                continue
            raise
        fn = getattr(found, name, None)
        if callable(fn):
            return f"{module}.{name}", fn, takes
    return None


def _needed(operation: str, what: str) -> tuple[str, Callable[..., Any], str]:
    found = find(operation)
    if found is None:
        raise NotBuilt(f"{what} is not available in this release (the PCI path is not built yet)")
    return found


def gpu(index: int, machine: Machine | None = None) -> FunctionInfo:
    """GPU ``index`` of ``machine`` (this machine by default), from its PCI listing."""
    if index < 0:
        raise Misuse(f"GPU index {index} is negative")
    m = machine or Machine.this()
    gpus = [f for f in m.functions() if is_gpu(f.vendor, f.class_code)]
    if index >= len(gpus):
        raise NoSuchGpu(f"{m.name} has no GPU {index} (it has {len(gpus)})")
    return gpus[index]


def confirm(question: str, yes: bool) -> bool:
    """Whether to go on: ``--yes``, or "y" typed on a terminal."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise Misuse("this changes the machine and needs confirmation: run it on a terminal "
                     "or pass --yes")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


QUESTIONS = {
    "detach": "Detach GPU {i} ({where}) from its kernel driver ({driver})? Whatever uses it, a "
              "display among them, loses it until `rig attach {i}` or a reboot.",
    "attach": "Give GPU {i} ({where}) back to its kernel driver? It is reset first if no "
              "driver holds it.",
    "reset": "Reset GPU {i} ({where})? Whatever runs on it now is ended.",
}
DONE = {
    "detach": "GPU {i} ({where}) is detached from its kernel driver: NV-PCI{suffix} can open it.",
    "attach": "GPU {i} ({where}) is back with its kernel driver.",
    "reset": "GPU {i} ({where}) is reset.",
}


def run_change(operation: str, index: int, *, yes: bool, machine: Machine | None = None) -> int:
    """Detach, attach or reset GPU ``index`` (of ``machine``, for a reset) after asking."""
    _, fn, _ = _needed(operation, f"rig {operation}")
    function = gpu(index, machine)
    name = chip(function.device).name
    where = (function.address if name is None else f"{function.address}, {name}") + (
        f", of {machine.name}" if machine is not None else "")
    text = {"i": index, "where": where, "driver": function.driver or "none",
            "suffix": "" if index == 0 else f":{index}"}
    if not confirm(QUESTIONS[operation].format(**text), yes):
        print("rig: not confirmed, so nothing was changed.", file=sys.stderr)
        return FAILURE
    result = fn(index) if machine is None else fn(index, machine=machine)
    # detach answers its progress: Detached, or part way with the reason (the spec's
    # Part_way why), which leaves the GPU neither with its driver nor ready to open.
    why = getattr(result, "why", None) or getattr(result, "reason", None)
    if why:
        print(f"rig: GPU {index} ({function.address}): {operation} went only part way: {why}.",
              file=sys.stderr)
        return FAILURE
    print(DONE[operation].format(**text))
    return OK


def run_firmware(which: str, directory: str | None, *, base_url: str | None) -> int:
    """Fetch the pinned NVIDIA GSP firmware set into ``directory`` (rig's own by default)."""
    if which != "nv":
        raise Misuse(f"rig knows the firmware of nv only, not {which!r}")
    _, fn, _ = _needed("firmware", "rig firmware nv")
    kwargs: dict[str, Any] = {}
    if base_url is not None:
        kwargs["base_url"] = base_url
    try:
        result = fn(directory, **kwargs) if directory is not None else fn(**kwargs)
    except RigError as e:
        if isinstance(e.__cause__, OSError):  # the network or the disk failed: nobody refused
            print(f"rig: {e}", file=sys.stderr)
            return FAILURE
        raise
    if result is not None and not isinstance(result, list):  # a list was printed as it went
        print(result)
    return OK
