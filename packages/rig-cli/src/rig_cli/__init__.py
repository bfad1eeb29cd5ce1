"""rig-cli: the ``rig`` command (``rig_cli.main.main`` is its entry point)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
