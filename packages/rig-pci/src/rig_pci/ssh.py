"""Another machine over SSH: ``Machine.ssh(destination)``.

OpenSSH's ``ssh`` command carries the connection, so ~/.ssh/config, keys, agents, jump hosts
and known_hosts work as they do for the user. Through it runs rig's agent
(:mod:`rig_pci.agent`), whose source, with rig_pci's and rig_edge's, goes over the connection
to the other machine's python3 (3.11 or later; nothing is installed there). One connection
carries every call, from any number of threads, until the machine is closed; one that
ended is started again by the machine's next listing or take (what was taken through it is
gone, as the agent's death let it go). Every failure raises :class:`rig_edge.RigError`
naming the machine and the cause: ssh's own message, no Python 3.11 there, another protocol,
a reply not the protocol's, a connection that ended mid-call, no answer within the timeout.
A call cut short so says that whether it was done is unknown.
"""

from __future__ import annotations

import contextlib
import mmap
import shlex
import subprocess
import threading
import weakref
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rig_edge
import rig_pci
from rig_edge import Misuse, RigError
from rig_pci.agent import HELLO, PROTOCOL, ProtocolError, decode_function, receive, send
from rig_pci.dma import DmaMemory
from rig_pci.listing import FunctionInfo, parse_address
from rig_pci.window import Window

TIMEOUT_S = 30.0
# Never ask (a password, a host key): refuse with ssh's own message. Notice a silent peer
# within 15 s. The caller's options come first, and ssh keeps the first value of each.
SSH_OPTIONS = ("-T", "-e", "none", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
NEEDS = "rig-pci-agent needs Python 3.11"
# Run by the other machine's python3 (any version: it must say so when too old), reading the
# agent's program from stdin: its length on a line, then the compressed program.
BOOTSTRAP = f"""import sys
if sys.version_info < (3, 11):
    sys.stdout.write("{NEEDS}, not %d.%d\\n" % sys.version_info[:2])
    sys.exit(3)
import zlib
i = sys.stdin.buffer
exec(zlib.decompress(i.read(int(i.readline()))))
"""
_IMPORTER = """import importlib.abc, importlib.util, sys
class _Sources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name not in SOURCES:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=SOURCES[name][0])
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        code = compile(SOURCES[module.__name__][1], "rig-agent:" + module.__name__, "exec")
        exec(code, module.__dict__)
sys.meta_path.insert(0, _Sources())
import rig_pci.agent
"""


def program(root: str) -> bytes:
    """The agent's program, compressed: rig_edge's and rig_pci's sources, an importer that
    prefers them to any installed there, and the agent serving the tree under ``root``."""
    sources: dict[str, tuple[bool, str]] = {}
    for package in (rig_edge, rig_pci):
        assert package.__file__ is not None
        for path in sorted(Path(package.__file__).parent.glob("*.py")):
            package_init = path.name == "__init__.py"
            name = package.__name__ + ("" if package_init else "." + path.stem)
            sources[name] = (package_init, path.read_text())
    text = f"SOURCES = {sources!r}\n{_IMPORTER}rig_pci.agent.main({root!r})\n"
    return zlib.compress(text.encode(), 9)


class _Call:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None


class Connection:
    """One ssh process and the agent at its other end. :meth:`call` may be called from any
    thread; the reader thread hands each reply to its caller."""

    def __init__(self, name: str, argv: list[str], payload: bytes, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.ended: str | None = None  # why the connection ended, once it has
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._pending: dict[int, _Call] = {}
        self._next = 0
        self._errors: list[bytes] = []
        self._hello = threading.Event()
        try:
            self._ssh = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise RigError(f"{name}: it cannot be reached: {argv[0]} cannot be run: "
                           f"{e.strerror}") from e
        assert self._ssh.stdin and self._ssh.stdout and self._ssh.stderr
        self._stderr = threading.Thread(target=self._read_errors, daemon=True)
        self._stderr.start()
        threading.Thread(target=self._read, daemon=True).start()
        with contextlib.suppress(RigError):  # ssh exited: the reader says why
            self._write(str(len(payload)).encode() + b"\n" + payload)
        if not self._hello.wait(timeout_s):
            self.close()
            raise RigError(f"{name}: rig's agent did not start within {timeout_s:g} s")
        if self.ended is not None:
            raise RigError(f"{name}: {self.ended}")

    def _read_errors(self) -> None:
        assert self._ssh.stderr
        for line in self._ssh.stderr:
            with self._lock:
                self._errors = [*self._errors, line][-20:]

    def _said(self) -> tuple[int, str]:
        """ssh's exit status, and what it exited with and wrote on stderr (its own message)."""
        try:
            status = self._ssh.wait(5)
        except subprocess.TimeoutExpired:
            self._ssh.kill()
            status = self._ssh.wait()
        self._stderr.join(2)
        with self._lock:
            text = b"".join(self._errors).decode(errors="replace").strip()
        said = " ".join(text.split())
        return status, f"ssh exited with status {status}" + (f": {said}" if said else "")

    def _start(self) -> str | None:
        """Read the agent's hello; the reason it is not one, or ``None``."""
        assert self._ssh.stdout
        line = self._ssh.stdout.readline(200)
        words = line.decode(errors="replace").split()
        if not line:
            status, said = self._said()
            if status == 127:  # POSIX sh: a command not found
                return (f"it cannot run rig's agent: it has no python3 (rig needs Python 3.11 "
                        f"there) ({said})")
            return f"it cannot be reached: {said}"
        if line.startswith(NEEDS.encode()):
            version = words[-1] if words else "?"
            return (f"it cannot run rig's agent: its python3 is Python {version}, and the agent "
                    "needs 3.11 or later")
        if len(words) == 2 and words[0] == HELLO and line.endswith(b"\n"):
            if words[1] != str(PROTOCOL):
                return (f"its agent speaks protocol version {words[1]}, and this rig "
                        f"speaks {PROTOCOL}")
            return None
        return f"what came back over ssh is not rig's agent protocol: it began {line[:80]!r}"

    def _read(self) -> None:
        assert self._ssh.stdout
        why = self._start()
        if why is not None:
            self._end(why)
            self._hello.set()
            return
        self._hello.set()
        while True:
            try:
                message = receive(self._ssh.stdout)
            except ProtocolError as e:
                self._end(f"its agent's reply is not the protocol's: {e}")
                return
            except (OSError, ValueError):
                message = None
            if message is None:
                self._end(f"the connection ended ({self._said()[1]})")
                return
            with self._lock:
                call = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
            if call is not None:
                call.reply = message
                call.done.set()

    def _end(self, why: str) -> None:
        with self._lock:
            if self.ended is None:
                self.ended = why
            pending, self._pending = self._pending, {}
        for call in pending.values():
            call.done.set()
        self._kill()

    def _kill(self) -> None:
        if self._ssh.poll() is None:
            self._ssh.kill()
            self._ssh.wait()

    def _write(self, data: bytes) -> None:
        assert self._ssh.stdin
        with self._writing:
            try:
                self._ssh.stdin.write(data)
                self._ssh.stdin.flush()
            except (OSError, ValueError) as e:
                raise RigError(f"{self.name}: the connection ended: {e}") from e

    def call(self, op: str, timeout_s: float | None = None, **args: Any) -> Any:
        """Run ``op`` there and return its result; raises as the module says."""
        call = _Call()
        with self._lock:
            if self.ended is not None:
                raise RigError(f"{self.name}: {self.ended}")
            self._next += 1
            n = self._next
            self._pending[n] = call
        unknown = f"whether {op} was done is unknown"
        try:
            with self._writing:
                assert self._ssh.stdin
                send(self._ssh.stdin, {"id": n, "op": op, "args": args})
        except (OSError, ValueError):
            pass  # the reader sees the end and says why
        wait = self.timeout_s if timeout_s is None else timeout_s
        if not call.done.wait(wait):
            with self._lock:
                self._pending.pop(n, None)
            raise RigError(f"{self.name}: {op} got no answer within {wait:g} s ({unknown})")
        reply = call.reply
        if reply is None:
            raise RigError(f"{self.name}: {self.ended} during {op} ({unknown})")
        error = reply.get("error")
        if isinstance(error, dict):
            message = str(error.get("message"))
            raise (Misuse if error.get("kind") == "misuse" else RigError)(message)
        if "ok" not in reply:
            self._end(f"its agent's reply is not the protocol's: {reply!r}")
            raise RigError(f"{self.name}: {self.ended} during {op} ({unknown})")
        return reply["ok"]

    def let_go(self, op: str, **args: Any) -> None:
        """Call ``op``, which lets go of something there, unless the connection ended: the
        agent's exit let go of everything it held, so a failure here changes nothing."""
        if self.ended is None:
            with contextlib.suppress(RigError):
                self.call(op, **args)

    def close(self) -> None:
        """End the connection: the agent sees its input end and exits, letting go of all it
        held there."""
        with self._lock:
            if self.ended is None:
                self.ended = "its connection was closed"
        if self._ssh.stdin:
            with contextlib.suppress(OSError):
                self._ssh.stdin.close()
        try:
            self._ssh.wait(2)
        except subprocess.TimeoutExpired:
            self._kill()


def _typed(name: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RigError(f"{name}: its agent's reply is not the protocol's: {value!r}")
    return value


class SshWindow(Window):
    """A window of a function on the other machine: each access one request, which the agent
    makes at its exact width there."""

    def __init__(self, connection: Connection, n: int, size: int, name: str) -> None:
        super().__init__(size, name)
        self._c = connection
        self._n = n
        self._closed = False

    def _read(self, offset: int, width: int) -> int:
        if self._closed:
            raise Misuse(f"{self.name}: the window is closed")
        value = self._c.call("read", window=self._n, offset=offset, width=width)
        return _typed(self._c.name, value, int)  # type: ignore[no-any-return]

    def _write(self, offset: int, width: int, value: int) -> None:
        if self._closed:
            raise Misuse(f"{self.name}: the window is closed")
        self._c.call("write", window=self._n, offset=offset, width=width, value=value)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._c.let_go("close_window", window=self._n)


class SshAccess:
    """A function the agent took on the other machine. Its memory is not this process's, so
    it maps no host memory and allocates no DMA memory (:class:`rig_pci.Function` refuses
    both first)."""

    maps_host = False
    dma_granule = mmap.PAGESIZE

    def __init__(self, connection: Connection, address: str) -> None:
        self._c = connection
        self._address = address
        taken = connection.call("take", address=address)
        try:
            self._n = _typed(connection.name, taken["handle"], int)
            self.how = f"{_typed(connection.name, taken['how'], str)}, over SSH"
            self._config = SshWindow(connection, _typed(connection.name, taken["config"], int),
                                     _typed(connection.name, taken["config_size"], int),
                                     f"{address} config space")
        except (KeyError, TypeError) as e:
            raise RigError(f"{connection.name}: its agent's reply is not the protocol's: "
                           f"{taken!r}") from e

    @property
    def can_reset(self) -> bool:
        return bool(self._c.call("can_reset", handle=self._n))

    def config(self) -> Window:
        return self._config

    def window(self, bar: int, offset: int, length: int, write_combined: bool,
               at: int | None = None) -> Window:
        if at is not None:
            raise RigError(f"{self._address} BAR {bar}: another machine's BAR cannot be "
                           "mapped into this process")
        got = self._c.call("window", handle=self._n, bar=bar, offset=offset, length=length,
                           write_combined=write_combined)
        try:
            return SshWindow(self._c, _typed(self._c.name, got["window"], int),
                             _typed(self._c.name, got["size"], int),
                             f"{self._address} BAR {bar}")
        except (KeyError, TypeError) as e:
            raise RigError(f"{self._c.name}: its agent's reply is not the protocol's: "
                           f"{got!r}") from e

    def reset(self) -> None:
        self._c.call("reset", handle=self._n)

    def alloc_dma(self, n: int, at: int | None) -> DmaMemory | None:
        raise RigError(f"{self._c.name}'s memory is not this process's")

    def map_host(self, address: int, length: int) -> DmaMemory | None:
        raise RigError(f"{self._c.name}'s memory is not this process's")

    def close(self) -> None:
        self._config.close()
        self._c.let_go("close", handle=self._n)


class RemoteLock:
    """A lock file the agent holds on the other machine until :meth:`release`."""

    def __init__(self, connection: Connection, n: int) -> None:
        self._c = connection
        self._n: int | None = n

    def release(self) -> None:
        n, self._n = self._n, None
        if n is not None:
            self._c.let_go("unlock", n=n)


class SshTransport:
    """The machine ``destination`` (``[user@]host``, or a name of ~/.ssh/config) reached by
    ``ssh``, through rig's agent serving its sysfs tree under ``root`` (``/``; a fixture in
    tests). ``port`` and ``options`` (more arguments of ssh, before rig's own) go to ssh;
    ``timeout_s`` bounds the start and each call."""

    shares_memory = False

    def __init__(self, destination: str, *, port: int | None = None,
                 options: Sequence[str] = (), timeout_s: float = TIMEOUT_S,
                 root: str = "/") -> None:
        if not destination or destination.startswith("-") or any(c.isspace()
                                                                  for c in destination):
            raise Misuse(f"{destination!r} is no SSH destination ([user@]host)")
        if port is not None and not 0 < port < 65536:
            raise Misuse(f"{port!r} is no TCP port")
        if isinstance(options, str):
            raise Misuse("options is a list of ssh's arguments, not one string")
        if not root.startswith("/"):
            raise Misuse(f"the tree's root there is an absolute path, not {root!r}")
        if not timeout_s > 0:
            raise Misuse(f"timeout_s must be positive, not {timeout_s!r}")
        self.destination = destination
        self.port = port
        self.timeout_s = timeout_s
        self._root = root
        self._argv = ["ssh", *options, *SSH_OPTIONS, *(("-p", str(port)) if port else ()),
                      "--", destination, f"exec python3 -c {shlex.quote(BOOTSTRAP)}"]
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._closed = False
        self._started: list[Connection] = []
        # A machine dropped without close closes its connections when collected.
        self._finalizer = weakref.finalize(self, _close_all, self._started)

    @property
    def name(self) -> str:
        port = f":{self.port}" if self.port else ""
        root = "" if self._root == "/" else self._root
        return f"the machine at ssh://{self.destination}{port}{root}"

    def connection(self) -> Connection:
        """The connection, started on first use and again after one ended."""
        with self._lock:
            if self._closed:
                raise Misuse(f"{self.name} was closed")
            c = self._connection
            if c is None or c.ended is not None:
                c = self._connection = Connection(self.name, self._argv, program(self._root),
                                                  self.timeout_s)
                self._started[:] = [c]
            return c

    def functions(self) -> list[FunctionInfo]:
        found = self.connection().call("functions")
        try:
            return [decode_function(d) for d in _typed(self.name, found, list)]
        except ProtocolError as e:
            raise RigError(f"{self.name}: its agent's reply is not the protocol's: {e}") from e

    def function(self, address: str) -> FunctionInfo:
        parse_address(address)
        found = self.connection().call("function", address=address)
        try:
            return decode_function(_typed(self.name, found, dict))
        except ProtocolError as e:
            raise RigError(f"{self.name}: its agent's reply is not the protocol's: {e}") from e

    def take(self, address: str) -> SshAccess:
        return SshAccess(self.connection(), address)

    def lock(self, name: str) -> RemoteLock:
        c = self.connection()
        return RemoteLock(c, _typed(self.name, c.call("lock", name=name), int))

    def close(self) -> None:
        """Close the connection (the agent lets go of all it holds there); later calls raise
        :class:`rig_edge.Misuse`. Again does nothing."""
        with self._lock:
            self._closed = True
            self._connection = None
        self._finalizer()


def _close_all(connections: list[Connection]) -> None:
    for c in connections:
        c.close()
