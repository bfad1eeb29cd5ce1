"""rig's agent: serves a machine's PCI functions to a rig elsewhere, over a pipe.

:mod:`rig_pci.ssh` sends this module's source, with rig_pci's and rig_edge's, to the other
machine and runs :func:`serve` there under Python 3.11 (nothing is installed there). It serves
that machine's sysfs tree exactly as :class:`rig_pci.sysfs.SysfsTransport` reads it here.

The protocol (version :data:`PROTOCOL`): the agent first writes the line ``rig-pci-agent N``;
then each side writes frames, a 4-byte big-endian length and that many bytes of UTF-8 JSON.
A request is ``{"id", "op", "args"}``; its reply ``{"id", "ok": result}`` or ``{"id",
"error": {"kind", "message"}}``, kind ``"misuse"`` (a :class:`rig_edge.Misuse`) or ``"rig"``.
Requests run concurrently, each in a thread; replies come as they finish. Functions, windows
and locks live until closed or until the connection ends, when the agent exits and the
kernel lets go of all it held.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from rig_edge import Misuse, RigError
from rig_pci import locks
from rig_pci.listing import Bar, FunctionInfo
from rig_pci.sysfs import SysfsTransport
from rig_pci.transport import Access
from rig_pci.window import Window

PROTOCOL = 1
HELLO = "rig-pci-agent"
MAX_FRAME = 1 << 24


class ProtocolError(Exception):
    """What came over the pipe is not a frame of the protocol."""


def send(out: IO[bytes], message: dict[str, Any]) -> None:
    """Write ``message`` as one frame and flush it."""
    data = json.dumps(message, separators=(",", ":")).encode()
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def _exactly(inp: IO[bytes], n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = inp.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def receive(inp: IO[bytes]) -> dict[str, Any] | None:
    """The next frame's message, or ``None`` at the end of the stream before one; raises
    :class:`ProtocolError` for anything else (a stream cut inside a frame, a length over
    :data:`MAX_FRAME`, bytes that are no JSON object)."""
    head = _exactly(inp, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise ProtocolError(f"a frame of {n} bytes (the protocol's are at most {MAX_FRAME}), "
                            f"starting {head!r}")
    data = _exactly(inp, n)
    if data is None:
        raise ProtocolError(f"the stream ended inside a frame of {n} bytes")
    try:
        message = json.loads(data)
    except ValueError as e:
        raise ProtocolError(f"a frame that is no JSON ({e}): {data[:60]!r}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a frame that is no JSON object: {data[:60]!r}")
    return message


def encode_function(info: FunctionInfo) -> dict[str, Any]:
    return asdict(info)


def decode_function(d: dict[str, Any]) -> FunctionInfo:
    """The :class:`FunctionInfo` :func:`encode_function` wrote; raises :class:`ProtocolError`
    if ``d`` is not one."""
    try:
        bars = tuple(Bar(**b) for b in d["bars"])
        return FunctionInfo(**{**d, "bars": bars})
    except (KeyError, TypeError) as e:
        raise ProtocolError(f"a function that is not laid out as the protocol's: {d!r}") from e


class Agent:
    """The machine whose sysfs tree lies under ``root`` (``/``: the agent's machine), and what
    the other side holds of it, by number. A tree's lock files lie in its own /run/lock."""

    def __init__(self, root: Path) -> None:
        self.transport = SysfsTransport(root, shares_memory=False)
        self.locks = locks.directory() if root == Path("/") else root / "run/lock"
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._access: dict[int, tuple[Access, int]] = {}
        self._windows: dict[int, Window] = {}
        self._held: dict[int, locks.FileLock] = {}

    def _keep(self, table: dict[int, Any], thing: object) -> int:
        with self._lock:
            n = next(self._ids)
            table[n] = thing
            return n

    def _window(self, n: int) -> Window:
        with self._lock:
            return self._windows[n]

    def _access_of(self, n: int) -> Access:
        with self._lock:
            return self._access[n][0]

    def functions(self) -> list[dict[str, Any]]:
        return [encode_function(f) for f in self.transport.functions()]

    def function(self, address: str) -> dict[str, Any]:
        return encode_function(self.transport.function(address))

    def take(self, address: str) -> dict[str, Any]:
        access = self.transport.take(address)
        config = access.config()
        w = self._keep(self._windows, config)
        n = self._keep(self._access, (access, w))
        return {"handle": n, "how": access.how, "maps_host": access.maps_host,
                "config": w, "config_size": config.size}

    def can_reset(self, handle: int) -> bool:
        return self._access_of(handle).can_reset

    def reset(self, handle: int) -> None:
        self._access_of(handle).reset()

    def window(self, handle: int, bar: int, offset: int, length: int,
               write_combined: bool) -> dict[str, Any]:
        w = self._access_of(handle).window(bar, offset, length, write_combined)
        return {"window": self._keep(self._windows, w), "size": w.size}

    def read(self, window: int, offset: int, width: int) -> int:
        return self._window(window).read(offset, width)

    def write(self, window: int, offset: int, width: int, value: int) -> None:
        self._window(window).write(offset, width, value)

    def close_window(self, window: int) -> None:
        with self._lock:
            w = self._windows.pop(window, None)
        if w is not None:
            w.close()

    def close(self, handle: int) -> None:
        with self._lock:
            access, config = self._access.pop(handle, (None, 0))
            self._windows.pop(config, None)
        if access is not None:
            access.close()

    def lock(self, name: str) -> int:
        if "/" in name or name in ("", ".", ".."):
            raise Misuse(f"a lock's name is a file name, not {name!r}")
        self.locks.mkdir(parents=True, exist_ok=True)
        return self._keep(self._held, locks.FileLock.take(self.locks / name))

    def unlock(self, n: int) -> None:
        with self._lock:
            held = self._held.pop(n, None)
        if held is not None:
            held.release()

    OPS = ("functions", "function", "take", "can_reset", "reset", "window", "read", "write",
           "close_window", "close", "lock", "unlock")

    def answer(self, request: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        """Run ``request`` and ``reply`` its answer (an error for a request not of the
        protocol)."""
        n = request.get("id")
        op, args = request.get("op"), request.get("args")
        try:
            if op not in self.OPS or not isinstance(args, dict):
                raise Misuse(f"the agent has no operation {op!r} with arguments {args!r}")
            try:
                result = getattr(self, str(op))(**args)
            except (KeyError, TypeError) as e:  # an unknown handle, a missing argument
                raise Misuse(f"{op} cannot be done with {args!r}: {e!r}") from e
        except Misuse as e:
            reply({"id": n, "error": {"kind": "misuse", "message": str(e)}})
        except (RigError, OSError) as e:
            reply({"id": n, "error": {"kind": "rig", "message": str(e)}})
        except Exception as e:  # a bug of the agent's: said, so the caller waits for nothing
            reply({"id": n, "error": {"kind": "rig", "message": f"rig's agent failed at {op}: "
                                                             f"{type(e).__name__}: {e}"}})
        else:
            reply({"id": n, "ok": result})


def serve(inp: IO[bytes], out: IO[bytes], root: str = "/") -> None:
    """Serve the machine whose tree lies under ``root`` over ``inp``/``out`` until ``inp``
    ends (or stops being the protocol's)."""
    agent = Agent(Path(root))
    writing = threading.Lock()

    def reply(message: dict[str, Any]) -> None:
        with writing:
            send(out, message)

    with writing:
        out.write(f"{HELLO} {PROTOCOL}\n".encode())
        out.flush()
    while True:
        try:
            request = receive(inp)
        except ProtocolError:
            return
        if request is None:
            return
        threading.Thread(target=agent.answer, args=(request, reply), daemon=True).start()


def main(root: str) -> None:
    """The agent's process: serve stdin/stdout (stray prints go to stderr), then exit at once,
    whatever threads still wait (the kernel lets go of their files and locks)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        serve(sys.stdin.buffer, out, root)
    finally:
        os._exit(0)
