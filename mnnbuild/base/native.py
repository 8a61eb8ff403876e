"""What native libraries print: MNN's and QNN's banners, kept off the terminal unless asked for.

MNN prints its CPU features and precision (``The device supports: ...``, ``MNN use high precision``) and QNN's
HTP library its thread-local setup (``# LIBNATIVE: ...``) straight to file descriptors 1 and 2, past Python's
streams and logging. `native_output` points both descriptors at a temp file while a native call runs; what was
printed is logged at DEBUG, or at ERROR when the call fails (then it may say why). Python's own writes during the
call (log records, warnings, progress bars) still reach the terminal: ``sys.stdout``/``sys.stderr`` write to the
original descriptors meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any, TextIO

log = logging.getLogger(__name__)

_FDS = (1, 2)
_QUIET_EXCEPTIONS = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""Not a failure of the native call: what it printed stays at DEBUG (a Ctrl-C is one line)."""


@functools.cache
def _c_fflush() -> Any:
    try:
        return ctypes.CDLL(None).fflush  # C stdio buffers what MNN's printf wrote until flushed
    except (OSError, AttributeError):
        return None


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fflush = _c_fflush()
    if fflush is not None:
        fflush(None)


def _on_fd(stream: Any, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # a Python-level capture (doit's, pytest's): not an fd
        return False


def _console(stream: TextIO, fd: int) -> TextIO:
    """A text stream like ``stream`` on (a duplicate of) ``fd``: where Python's writes go while ``stream``'s own
    descriptor points at the capture file."""
    raw = io.FileIO(fd, "w", closefd=True)
    encoding = getattr(stream, "encoding", None) or "utf-8"  # doit's Writer has neither
    return io.TextIOWrapper(raw, encoding=encoding, errors=getattr(stream, "errors", None), line_buffering=True)


_CONSOLES: list[TextIO] = []
"""While `native_output` captures fd 2 (innermost last): a stream on the stderr it had. File descriptors belong to
the process, and so does this."""


class CurrentStderr:
    """A stream for log handlers and progress bars: ``stream`` (default: ``sys.stderr`` when made), except while
    `native_output` captures the descriptor ``stream`` writes to; then the stderr that descriptor had."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr

    def _target(self) -> TextIO:
        return _CONSOLES[-1] if _CONSOLES and _on_fd(self.stream, 2) else self.stream

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


@contextlib.contextmanager
def native_output(what: str) -> Iterator[None]:
    """Capture what native code prints on fds 1 and 2 inside the block: logged at DEBUG on success, at ERROR (as
    ``<what> printed: ...``) when the block raises. Nested blocks capture their own part."""
    _flush_all()
    saved = {fd: os.dup(fd) for fd in _FDS}
    outer = not _CONSOLES  # an inner block writes where the outer one does
    console = _console(sys.stderr, os.dup(saved[2])) if outer else _CONSOLES[-1]
    _CONSOLES.append(console)
    swapped: dict[str, tuple[TextIO, TextIO]] = {}
    try:
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = getattr(sys, name)
            if outer and _on_fd(stream, fd):  # Python's own writes (warnings, print) keep reaching the terminal
                swapped[name] = (stream, console if fd == 2 else _console(stream, os.dup(saved[fd])))
                setattr(sys, name, swapped[name][1])
        with tempfile.TemporaryFile() as sink:
            failed = True
            try:
                for fd in _FDS:
                    os.dup2(sink.fileno(), fd)
                try:
                    yield
                    failed = False
                except _QUIET_EXCEPTIONS:
                    failed = False
                    raise
                finally:
                    _flush_all()
                    for fd in _FDS:
                        os.dup2(saved[fd], fd)
            finally:
                sink.seek(0)
                text = sink.read().decode("utf-8", "replace").strip()
                if text:
                    log.log(logging.ERROR if failed else logging.DEBUG, "%s printed:\n%s", what, text)
    finally:
        for name, (stream, replacement) in swapped.items():
            setattr(sys, name, stream)
            if replacement is not console:
                with contextlib.suppress(Exception):
                    replacement.close()
        _CONSOLES.pop()
        if outer:
            with contextlib.suppress(Exception):
                console.close()
        for fd in saved.values():
            os.close(fd)
