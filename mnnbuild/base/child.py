"""Work in a child process that never outlives the process that asked for it.

:class:`Child` runs a picklable function in a new process (a ``multiprocessing`` context's: a forkserver's child,
a spawned interpreter) with one pipe between them, over which both may send objects while it runs; the function's
return value or exception comes back at the end (:meth:`Child.result`). The child never outlives its requester:

- stopped here (Ctrl-C, SIGTERM handled as KeyboardInterrupt, any exception), ``with Child(...)`` kills it on the
  way out (:meth:`Child.stop`);
- killed here (``kill -9``, the OOM killer), the pipe's other end closes, and a thread of the child that watches it
  kills the child at once, whatever it is busy with. (A parent-death signal would not do: a forkserver's child has
  the forkserver for parent, which lives as long as any of its children.)
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import pickle
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any

from mnnbuild.base.errors import ChildDiedError, MnnbuildError, error_line
from mnnbuild.base.logs import configure_logging

log = logging.getLogger(__name__)

_POLL_S = 0.2
"""How long a wait for the child blocks before it looks again: an interrupt of this process is seen that fast."""


def skip_final_collection() -> None:
    """End this process without the interpreter's last garbage collection over every object it still holds: a
    process that imported pydantic, numpy and the stages spends about 80 ms of a 650 ms no-op doit there, which the
    OS does at once. Only cycles still alive at exit go uncollected: what they hold (files, temp dirs, connections)
    is closed explicitly by whoever opened it, as interpreter exit never promised to run their ``__del__``."""
    atexit.register(gc.freeze)  # atexit runs before the final collection; frozen objects are left out of it


class Channel:
    """The child's end of the pipe: :meth:`send` to the requester, :meth:`recv` what it sent."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._inbox: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._watch, name="requester-watch", daemon=True).start()

    def _watch(self) -> None:
        """Every message the requester sends, into the inbox; the pipe's end (the requester is gone, however it
        ended) kills this process."""
        try:
            while True:
                self._inbox.put(self._conn.recv())
        except (EOFError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    def send(self, obj: Any) -> None:
        self._conn.send(("msg", obj))

    def recv(self) -> Any:
        return self._inbox.get()


def _child_main(conn: Connection, target: Callable[..., Any], args: tuple[Any, ...], log_level: str) -> None:
    configure_logging(log_level)  # as in the requester
    channel = Channel(conn)
    try:
        value = target(channel, *args)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the requester
        conn.send(("error", picklable(exc)))
    else:
        conn.send(("ok", value))
    gc.freeze()  # a spawned child then exits as `skip_final_collection` says, and its requester waits less for it


def picklable(exc: BaseException) -> BaseException:
    """``exc`` if it crosses a pipe whole, else a :class:`MnnbuildError` saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling problem
        return MnnbuildError(error_line(exc))
    return exc


@contextlib.contextmanager
def _interrupts_held() -> Iterator[list[int]]:
    """Hold Ctrl-C and SIGTERM while the body runs (a child's start), listing those that came: interrupted there,
    the child exists but its pid is not known yet, so it could be neither killed nor told to go, and a forkserver's
    child then prints a traceback of the pipe its parent closed. Only the main thread handles signals: elsewhere,
    and where a handler was not set from Python, nothing is held."""
    held: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or any(signal.getsignal(s) is None for s in signals):
        yield held
        return
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in signals}
    try:
        yield held
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Child:
    """``target(channel, *args)`` in a child process of ``ctx`` (see the module doc); started by the constructor.

    :meth:`recv` gets what the child sent with ``channel.send``, :meth:`send` sends to its ``channel.recv``,
    :meth:`result` waits for the return value (the child's exception is raised here). Use it in a ``with``: on the
    way out a child still running is killed."""

    def __init__(self, ctx: BaseContext, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self.name = name
        self._conn, theirs = ctx.Pipe()
        level = logging.getLevelName(logging.getLogger("mnnbuild").getEffectiveLevel())
        self.process: BaseProcess = ctx.Process(  # type: ignore[attr-defined]
            target=_child_main, args=(theirs, target, args, level), name=name, daemon=True
        )
        self._final: tuple[str, Any] | None = None
        held: list[int] = []
        try:
            with _interrupts_held() as held:
                self.process.start()
        except BaseException:
            self._conn.close()
            if held:  # a Ctrl-C to the process group also hits the forkserver, and the start fails on its pipe
                signal.raise_signal(held[0])
            raise
        finally:
            theirs.close()
        try:  # an interrupt that came while the child started, now that it can be killed
            for signum in held:
                signal.raise_signal(signum)
        except BaseException:
            self.stop()
            raise

    def send(self, obj: Any) -> None:
        self._conn.send(obj)

    def _next(self) -> tuple[str, Any]:
        """The next message; a :class:`ChildDiedError` when the child died without one. Polls in short waits."""
        while True:
            if self._conn.poll(_POLL_S):
                try:
                    return self._conn.recv()
                except EOFError:
                    break
            if not self.process.is_alive() and not self._conn.poll(0):
                break
        self.process.join()
        raise ChildDiedError(f"the {self.name} process died (exit code {self.process.exitcode})")

    def recv(self) -> Any:
        """The next object the child sent (``channel.send``); its exception, if it failed first."""
        if self._final is None:
            kind, payload = self._next()
            if kind == "msg":
                return payload
            self._final = (kind, payload)
        kind, payload = self._final
        if kind == "error":
            raise payload
        raise ChildDiedError(f"the {self.name} process ended without sending what was waited for")

    def result(self) -> Any:
        """The child's return value (messages it sent and nobody received are dropped); its exception, raised."""
        while self._final is None:
            kind, payload = self._next()
            if kind != "msg":
                self._final = (kind, payload)
        kind, payload = self._final
        if kind == "error":
            raise payload
        return payload

    def stop(self, timeout: float = 60.0) -> None:
        """Let a child that has sent its result exit (``timeout`` s), kill one still running; close the pipe."""
        try:
            if self.process.pid is not None:
                if self._final is not None:
                    self.process.join(timeout=timeout)
                if self.process.is_alive():
                    self.process.kill()
                    self.process.join()
        finally:
            self._conn.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
