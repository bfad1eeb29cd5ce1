"""A real SSH server on 127.0.0.1 for the tests of ``Machine.ssh``: asyncssh's, in this
process (its own thread and event loop), with a host key and a client key made for the test.

Each session's command runs as ``/bin/sh -c COMMAND`` with the environment :attr:`Server.env`,
its stdin, stdout and stderr carried over the SSH channel, as sshd runs one. OpenSSH's ``ssh``
client (which ``Machine.ssh`` runs) connects with :meth:`Server.options`; the agent it starts
serves a fixture tree (:meth:`Server.machine`). :meth:`Server.drop` cuts every connection
from the server's side. Tests that need this skip, saying so, where the ssh client is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from rig_pci import Machine
from rig_pci.ssh import SshTransport

SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(
    SSH is None, reason="OpenSSH's ssh client is not installed here, and Machine.ssh runs it"
)


class Server:
    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.env: dict[str, str] = {"PATH": os.environ["PATH"], "HOME": str(home),
                                    "LANG": "C"}
        self.connections: list[asyncssh.SSHServerConnection] = []
        self.sessions = 0
        self.processes: list[asyncio.subprocess.Process] = []
        host = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key = host
        client = asyncssh.generate_private_key("ssh-ed25519")
        self.key = home / "id_ed25519"
        client.write_private_key(str(self.key))
        self.key.chmod(0o600)
        self._authorized = asyncssh.import_authorized_keys(
            client.export_public_key().decode())
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.port: int = self._server.sockets[0].getsockname()[1]
        self.known_hosts = home / "known_hosts"
        self.trust(host)

    def trust(self, key: asyncssh.SSHKey) -> None:
        """Make ``key`` the host key the client expects of 127.0.0.1 on this port."""
        line = f"[127.0.0.1]:{self.port} {key.export_public_key().decode().strip()}\n"
        self.known_hosts.write_text(line)

    async def _start(self) -> Any:
        outer = self

        class Accept(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                outer.connections.append(conn)

        return await asyncssh.create_server(
            Accept, "127.0.0.1", 0, server_host_keys=[self.host_key],
            authorized_client_keys=self._authorized, process_factory=self._run,
            encoding=None, allow_scp=False,
        )

    async def _run(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.sessions += 1
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", process.command or "", env=self.env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
        self.processes.append(proc)
        assert proc.stdin and proc.stdout and proc.stderr

        async def feed() -> None:  # the client's bytes to the command, until either ends
            assert proc.stdin
            with contextlib.suppress(OSError, asyncssh.Error):
                while data := await process.stdin.read(1 << 16):
                    proc.stdin.write(data)
                    await proc.stdin.drain()
            with contextlib.suppress(OSError):
                proc.stdin.close()

        async def carry(source: asyncio.StreamReader, to: Any) -> None:
            with contextlib.suppress(OSError, asyncssh.Error):
                while data := await source.read(1 << 16):
                    to.write(data)

        feeding = asyncio.ensure_future(feed())
        await asyncio.gather(carry(proc.stdout, process.stdout),
                             carry(proc.stderr, process.stderr))
        status = await proc.wait()
        feeding.cancel()
        with contextlib.suppress(OSError, asyncssh.Error):
            process.exit(status)

    def options(self, key: Path | None = None) -> list[str]:
        """ssh's arguments for this server: no user config, the test's key and known hosts."""
        return ["-F", "/dev/null", "-i", str(key or self.key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                "-o", "LogLevel=ERROR"]

    def machine(self, root: Path, **kwargs: Any) -> Machine:
        """The fixture tree under ``root`` as the machine at the other end."""
        return Machine(SshTransport("127.0.0.1", port=self.port, options=self.options(),
                                    root=str(root), **kwargs))

    def drop(self) -> None:
        """Cut every connection from the server's side, as a network or a peer would."""
        for conn in list(self.connections):
            self.loop.call_soon_threadsafe(conn.abort)

    async def _stop(self) -> None:
        self._server.close()
        for conn in self.connections:
            conn.abort()
        for proc in self.processes:  # the commands this server started, by their ids
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
        await self._server.wait_closed()

    def close(self) -> None:
        """Stop serving, end every command it started, and close the event loop."""
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Server]:
    if SSH is None:
        pytest.skip("OpenSSH's ssh client is not installed here, and Machine.ssh runs it")
    server = Server(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.close()
