"""The ``rig`` command.

Exit codes: 0 ok; 1 failure (something broke); 2 misuse (bad arguments); 3 no such GPU;
4 refused (the machine or its driver said no). Errors are one sentence on stderr; ``--debug``
adds the traceback. Start-up stays light: a command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

OK, FAILURE, MISUSE, NO_GPU, REFUSED = 0, 1, 2, 3, 4


def _parser() -> argparse.ArgumentParser:
    from rig_cli import __version__

    parser = argparse.ArgumentParser(
        prog="rig",
        description="NVIDIA GPUs with no CUDA library: through NVIDIA's kernel driver (NV) "
        "or over PCI with no driver (NV-PCI).",
        epilog="exit codes: 0 ok, 1 failure, 2 misuse, 3 no such GPU, 4 refused",
    )
    parser.add_argument("--version", action="version", version=f"rig {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    lister = sub.add_parser(
        "list", help="list this machine's NVIDIA GPUs and the paths that open them"
    )
    lister.add_argument("--json", action="store_true", help="print JSON")
    lister.add_argument(
        "--machine",
        metavar="ROOT",
        help="list the machine whose sysfs tree lies under ROOT (default: this machine)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rig`` with ``argv`` (default: the process's arguments); return its exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return MISUSE
    try:
        if args.command == "list":
            from rig_cli.listing import run_list
            from rig_pci import Machine

            machine = Machine.at(args.machine) if args.machine else Machine.this()
            return run_list(as_json=args.json, machine=machine)
    except Exception as e:
        from rig_edge import RigError

        if args.debug:
            raise
        print(f"rig: {e}", file=sys.stderr)
        return REFUSED if isinstance(e, RigError) else FAILURE
    return MISUSE
