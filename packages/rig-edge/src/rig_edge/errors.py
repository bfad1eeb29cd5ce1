"""The error policy every rig package keeps.

- What the world may refuse (the spec's ``Error msg``) raises :class:`RigError` or a subclass.
  Its message names the GPU, the operation and the cause, in that order where it can.
- Running out where the spec answers ``None`` returns ``None`` (``alloc``); a call that cannot
  answer ``None`` raises :class:`OutOfMemory`, which is also a :class:`MemoryError`.
- Misuse (the spec's ``Invalid_argument``: a negative GPU index, a length that is not
  positive, a call from inside a lock's callback) raises :class:`Misuse`, a :class:`ValueError`,
  having changed nothing.
- A device that faulted is lost: every later use raises :class:`Lost` naming the fault, while
  its facts still answer.
"""

from __future__ import annotations

import functools
from typing import Any


class RigError(Exception):
    """Something the machine, its driver or its GPU refused; the message says what and why."""


class OpenRefused(RigError):
    """An opener's ``make`` could not make its device.

    ``stays`` names what the attempt kept for the process (the spec's "what stays"), or is
    empty when the attempt gave back everything it took.
    """

    def __init__(self, message: str, *, stays: str = "") -> None:
        super().__init__(message + (f" ({stays} stays for the process)" if stays else ""))
        self.stays = stays


class Lost(RigError):
    """The device is lost: it faulted, hung or stopped answering.

    ``reason`` is the first cause, kept for every later use of the device.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the device is lost: {reason}")
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # copy.copy and pickle rebuild an exception as cls(*args): args is the whole message,
        # which __init__ would prefix again. Rebuild from the reason instead.
        return (type(self), (self.reason,), self.__dict__)


class Fault(Lost):
    """The GPU's work faulted.

    ``channel_error`` is NVIDIA's name of the channel error (a robust-channel / Xid name), with
    what the GPU reported of it where known (an MMU fault's type, an SM exception's error);
    ``address``, ``access`` and ``engine`` say where, for SM and MMU faults, when known; ``pc``
    is the program counter of the warp whose error an SM exception reports, when known. Each is
    ``None`` where unknown, and the message names those that are known.
    """

    def __init__(
        self,
        channel_error: str,
        *,
        address: int | None = None,
        access: str | None = None,
        engine: str | None = None,
        pc: int | None = None,
    ) -> None:
        parts = [channel_error]
        if address is not None:
            parts.append(f"at 0x{address:x}")
        if access:
            parts.append(f"on {access}")
        if engine:
            parts.append(f"by {engine}")
        text = " ".join(parts)
        if pc is not None:
            text += f", pc 0x{pc:x}"
        super().__init__(text)
        self.channel_error = channel_error
        self.address = address
        self.access = access
        self.engine = engine
        self.pc = pc

    def __reduce__(self) -> tuple[Any, ...]:
        rebuild = functools.partial(type(self), address=self.address, access=self.access,
                                    engine=self.engine, pc=self.pc)
        return (rebuild, (self.channel_error,), self.__dict__)


class OutOfMemory(RigError, MemoryError):
    """The GPU or its driver ran out of memory in a call that cannot answer ``None``."""


class Misuse(ValueError):
    """The caller broke a call's contract; nothing was changed."""
