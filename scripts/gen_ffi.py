"""Regenerate rig's pre-built cffi modules (rig_nv.prebuilt) from the declarations in the source.

Run from anywhere after changing a cdef text in rig_nv/layouts.py, rig_nv/hostmem.py or
rig_nv_nvidia/layouts.py: ``python3 scripts/gen_ffi.py``. It imports the packages from this
checkout's packages/*/src (not an installed copy) and writes each module of their ``PREBUILT``
mappings beside its package's ``__init__.py``; commit the files it names.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every module that declares cdef text for a generated module, in a PREBUILT mapping.
OWNERS = ("rig_nv.layouts", "rig_nv.hostmem", "rig_nv_nvidia.layouts")


def main() -> None:
    sys.path[:0] = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    from rig_nv import prebuilt

    for owner in OWNERS:
        for module, cdef in importlib.import_module(owner).PREBUILT.items():
            path = prebuilt.write(module, cdef, owner)
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
