"""Sphinx configuration of rig's API reference: autodoc over each package's public surface.

Build: python -m sphinx -W -b html docs/api build/api (tests/test_docs.py runs it).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]

project = "rig"
copyright = "2026, the rig authors"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
html_theme = "alabaster"
exclude_patterns: list[str] = []
