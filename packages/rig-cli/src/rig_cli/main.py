"""The ``rig`` command.

Exit codes: 0 ok; 1 failure (something broke, or a check's results differ); 2 misuse (bad
arguments); 3 no such GPU; 4 refused (the machine or its driver said no, or this release cannot
do it). Errors are one sentence on stderr; ``--debug`` re-raises for the traceback. Start-up
stays light: this module imports only argparse and sys, and a command imports what it needs
when it runs (``rig list`` reads sysfs through rig_pci alone; only info, usage and check load
the kernel-driver path).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rig_pci import Machine

OK, FAILURE, MISUSE, NO_GPU, REFUSED = 0, 1, 2, 3, 4

EPILOG = """\
exit codes:
  0  ok
  1  failure: something broke, or a check's results differ from the host's
  2  misuse: bad arguments
  3  no such GPU
  4  refused: the machine or its driver said no (e.g. the kernel driver does not hold the
     GPU, its release is not supported), or this release of rig cannot do it

Errors are one sentence on stderr, starting "rig: "; --debug shows the traceback.
A value that is not there prints as [N/A] (null in JSON).
"""


def _check_ranges(args: argparse.Namespace) -> None:
    """Values argparse took but that are out of range: :class:`rig_edge.Misuse` naming the
    flag (exit 2), checked before anything is opened."""
    import math

    from rig_edge import Misuse

    index = getattr(args, "index", None)
    if index is not None and index < 0:
        raise Misuse(f"the GPU's index i is 0 or more, not {index}")
    for flag in ("window", "watch"):
        value = getattr(args, flag, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise Misuse(f"--{flag} needs a positive number of seconds, not {value:g}")
    size = getattr(args, "size", None)
    if size is not None and size <= 0:
        raise Misuse(f"--size needs a positive number of MiB, not {size}")


class _Csv(argparse.Action):
    """``--format csv[,noheader]``, checked as it is parsed (a bad one is misuse, exit 2)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from rig_cli.listing import parse_format

        try:
            setattr(namespace, self.dest, parse_format(str(values)))
        except ValueError as e:
            parser.error(str(e))


class _Query(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from rig_cli.listing import parse_query

        try:
            setattr(namespace, self.dest, parse_query(str(values)))
        except ValueError as e:
            parser.error(str(e))


def _parser() -> argparse.ArgumentParser:
    from rig_cli import __version__

    parser = argparse.ArgumentParser(
        prog="rig",
        description="NVIDIA GPUs with no CUDA library: through NVIDIA's kernel driver (NV) "
        "or over PCI with no driver (NV-PCI).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rig {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    # --debug is taken after the command too (`rig check --debug`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, parents=[common])

    def index(p: argparse.ArgumentParser, optional: bool = True) -> None:
        if optional:
            p.add_argument("index", nargs="?", type=int, default=0, metavar="i",
                           help="the GPU's index, in bus order (default 0)")
        else:
            p.add_argument("index", type=int, metavar="i", help="the GPU's index, in bus order")

    lister = command("list", "list this machine's NVIDIA GPUs and the paths that open them")
    shape = lister.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print JSON")
    shape.add_argument(
        "--format", action=_Csv, metavar="csv[,noheader]",
        help="print CSV as nvidia-smi's query mode does (', ' between values)",
    )
    lister.add_argument(
        "--query", "--query-gpu", action=_Query, metavar="COLUMNS",
        help="the columns to print, comma-separated (CSV unless --json): index, bus, "
        "device_id, name, chip, arch, driver, runtime_status, paths, driver_release, "
        "bar1_bytes, memory_bytes, uuid",
    )
    lister.add_argument(
        "--memory", action="store_true",
        help="also each GPU's memory and UUID, read from the kernel driver's RM (loads "
        "rig_nv_nvidia: slower than the sysfs listing)",
    )
    machine_help = ("the machine: ssh://[user@]host[:port] over SSH (rig's agent runs on its "
                    "python3; nothing is installed there; a /ROOT after it names the directory "
                    "its sysfs tree lies under there), or the directory a sysfs tree lies "
                    "under here (default: this machine)")
    lister.add_argument("--machine", metavar="MACHINE", help=machine_help)

    info = command("info", "open a GPU through its kernel driver and show its facts")
    index(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--machine", metavar="MACHINE",
                      help=machine_help + "; another machine's GPU is not opened: its PCI facts "
                      "are shown")

    usage = command("usage", "show a GPU's memory (total, free) and how busy it is")
    index(usage)
    usage.add_argument("--window", type=float, default=1.0, metavar="S",
                       help="busy is the mean over the last S seconds (default 1)")
    usage.add_argument("--watch", type=float, metavar="S",
                       help="refresh every S seconds until Ctrl-C: in place on a terminal, a "
                       "line per sample otherwise")
    usage.add_argument("--json", action="store_true", help="print JSON (a line per sample)")

    check = command("check", "open a GPU, copy random data both ways, run a built-in kernel "
                    "for its architecture, compare with the host, print timings")
    index(check)
    check.add_argument("--size", type=int, default=64, metavar="MiB",
                       help="bytes each copy moves, in MiB (default 64)")
    check.add_argument("--json", action="store_true", help="print JSON")

    for name, text in (
        ("detach", "detach a GPU from its kernel driver so that NV-PCI can open it"),
        ("attach", "give a GPU back to its kernel driver"),
        ("reset", "reset a GPU's PCI function"),
    ):
        p = command(name, text)
        index(p, optional=False)
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        if name == "reset":
            p.add_argument("--machine", metavar="MACHINE", help=machine_help)

    firmware = command("firmware", "fetch the GSP firmware set the NV-PCI path boots with")
    firmware.add_argument("which", choices=["nv"], help="whose firmware (nv: NVIDIA's)")
    firmware.add_argument("dir", nargs="?", metavar="DIR",
                          help="where to put it (default: rig's own firmware directory)")
    firmware.add_argument("--base-url", metavar="URL",
                          help="fetch from this mirror of linux-firmware instead")
    return parser


def exit_code(e: BaseException) -> int:
    """The exit code of an error: misuse 2, no such GPU 3, refused 4, a lost device or
    anything else 1 (a firmware download that failed among them)."""
    from rig_cli.changes import NoSuchGpu
    from rig_edge import Lost, RigError
    from rig_pci.firmware import FetchFailed

    if isinstance(e, ValueError):  # rig_edge.Misuse is one
        return MISUSE
    # An open's refusal, or usage's error (a RigError: usage opens nothing), of no GPU i.
    if isinstance(e, NoSuchGpu) or (isinstance(e, RigError) and "has no GPU" in str(e)):
        return NO_GPU
    if isinstance(e, Lost | FetchFailed):  # the GPU or the network broke: nobody refused
        return FAILURE
    if isinstance(e, RigError):
        return REFUSED
    return FAILURE


def sentence(e: BaseException) -> str:
    """The error as one line: ``rig: <message>`` (and its type where it is not rig's own)."""
    from rig_edge import Misuse, RigError

    text = " ".join(str(e).split()) or type(e).__name__
    if not isinstance(e, RigError | Misuse):
        text = f"{type(e).__name__}: {text} (--debug shows the traceback)"
    return f"rig: {text}"


def machine_of(text: str) -> Machine:
    """``--machine``: ``ssh://[user@]host[:port][/ROOT]`` over SSH (ROOT: where the sysfs
    tree lies there, ``/`` by default), anything else the directory a sysfs tree lies under
    here. Raises :class:`rig_edge.Misuse` for an ssh:// address that is not of that form."""
    from rig_edge import Misuse
    from rig_pci import Machine

    if not text.startswith("ssh://"):
        if not Path(text).is_dir():
            raise Misuse(f"--machine {text}: no such directory (it names the root of a "
                         "machine's sysfs tree, or is ssh://[user@]host[:port])")
        return Machine.at(text)
    where, _, root = text.removeprefix("ssh://").partition("/")
    user, at, hostport = where.rpartition("@")
    if hostport.startswith("["):  # an IPv6 address: [::1]:22
        host, _, tail = hostport[1:].partition("]")
        port = tail.removeprefix(":") if tail.startswith(":") else tail
    else:
        host, _, port = hostport.partition(":")
    if not host or (at and not user) or (port and not port.isdigit()):
        raise Misuse(f"--machine {text!r} is not ssh://[user@]host[:port][/ROOT]")
    return Machine.ssh(f"{user}@{host}" if at else host, port=int(port) if port else None,
                       root="/" + root.rstrip("/"))


def _run(args: argparse.Namespace) -> int:
    _check_ranges(args)
    machine = machine_of(args.machine) if getattr(args, "machine", None) else None
    try:
        return _command(args, machine)
    finally:
        if machine is not None:
            machine.close()


def _command(args: argparse.Namespace, machine: Machine | None) -> int:
    if args.command == "list":
        from rig_cli.listing import run_list

        fmt = args.format
        if args.query and fmt is None and not args.json:
            fmt = ("csv", True)  # the columns asked for are the CSV's and JSON's vocabulary
        return run_list(as_json=args.json, machine=machine, fmt=fmt, columns=args.query,
                        memory=args.memory)
    if args.command == "info":
        from rig_cli.info import run_info, run_pci_info

        if machine is not None:
            return run_pci_info(args.index, machine, as_json=args.json)
        return run_info(args.index, as_json=args.json)
    if args.command == "usage":
        from rig_cli.info import run_usage

        return run_usage(args.index, window=args.window, watch=args.watch, as_json=args.json)
    if args.command == "check":
        from rig_cli.check import run_check

        return run_check(args.index, size_mib=args.size, as_json=args.json)
    if args.command in ("detach", "attach", "reset"):
        from rig_cli.changes import run_change

        return run_change(args.command, args.index, yes=args.yes, machine=machine)
    if args.command == "firmware":
        from rig_cli.changes import run_firmware

        return run_firmware(args.which, args.dir, base_url=args.base_url)
    raise AssertionError(f"unhandled command {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rig`` with ``argv`` (default: the process's arguments); return its exit code."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return MISUSE
    try:
        return _run(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("rig: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`rig list | head -1`): not an error; keep Python from
        # complaining about the closed stdout at exit.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK
    except Exception as e:
        if args.debug:
            raise
        code = exit_code(e)
        if code == NO_GPU and getattr(args, "index", None) is not None:
            print(f"rig: this machine has no GPU {args.index}; `rig list` shows its GPUs.",
                  file=sys.stderr)
        else:
            print(sentence(e), file=sys.stderr)
        return code
