"""Finding and loading Qualcomm's QNN libraries (HTP backend + QnnSystem) through cffi.

Search order: an explicit directory, then ``$QNN_SDK_ROOT/lib/x86_64-linux-clang/``, then the
``onnxruntime_qnn`` package (PyPI ``onnxruntime-qnn`` ships Qualcomm's x86_64 libraries).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import QnnError
from mnnbuild.base.native import native_output
from mnnbuild.qnn._generated.qnn_ffi import ffi as QNN_FFI

log = logging.getLogger(__name__)
#: QNN's own messages are logged under this name.
qnn_log = logging.getLogger("mnnbuild.qnn.lib")

BACKEND_LIB = "libQnnHtp.so"
SYSTEM_LIB = "libQnnSystem.so"
SDK_LIB_SUBDIR = Path("lib") / "x86_64-linux-clang"
HTP_BACKEND_ID = 6

QNN_SUCCESS = 0
# QnnLog_Level_t
LOG_ERROR, LOG_WARN, LOG_INFO, LOG_VERBOSE, LOG_DEBUG = 1, 2, 3, 4, 5
# QNN's warnings are its optimizer's notes (tiling, op packages, perf estimates), dozens per graph
# and none actionable by a user; they show at INFO. Its errors stay errors and end up in QnnError.
_QNN_TO_PY_LEVEL = {
    LOG_ERROR: logging.ERROR,
    LOG_WARN: logging.INFO,
    LOG_INFO: logging.INFO,
    LOG_VERBOSE: logging.DEBUG,
    LOG_DEBUG: logging.DEBUG,
}
# Messages the API 2.40 library logs as errors on every successful graphCreate; kept at DEBUG so
# they neither alarm users nor end up in QnnError texts.
_BENIGN_ERRORS = ("unexpected GraphHtpSettings option 66",)
_HOW_TO_GET = (
    "install the PyPI package `onnxruntime-qnn` (it ships Qualcomm's x86_64 libQnnHtp.so, "
    "libHtpPrepare.so and libQnnSystem.so), or install the Qualcomm AI Engine Direct (QNN) SDK and "
    "set QNN_SDK_ROOT to it (libraries in $QNN_SDK_ROOT/lib/x86_64-linux-clang/)"
)


@dataclass(frozen=True)
class QnnLibraryPaths:
    """Where the backend and system libraries were found, and how."""

    lib_dir: Path
    backend: Path
    system: Path
    source: str  # "explicit", "QNN_SDK_ROOT" or "onnxruntime_qnn"


def _candidate(lib_dir: Path, source: str) -> QnnLibraryPaths | None:
    backend, system = lib_dir / BACKEND_LIB, lib_dir / SYSTEM_LIB
    if backend.is_file() and system.is_file():
        return QnnLibraryPaths(lib_dir.resolve(), backend.resolve(), system.resolve(), source)
    return None


def _onnxruntime_qnn_dir() -> Path | None:
    spec = importlib.util.find_spec("onnxruntime_qnn")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_qnn_libraries(lib_dir: str | os.PathLike[str] | None = None) -> QnnLibraryPaths:
    """Locate ``libQnnHtp.so`` and ``libQnnSystem.so``.

    An explicit ``lib_dir`` must hold both (no fallback: the caller asked for that one). Otherwise
    ``$QNN_SDK_ROOT`` wins when set; a set but broken ``QNN_SDK_ROOT`` is an error rather than a
    silent fallback, so a user never builds with a library other than the one they chose.
    """
    if lib_dir is not None:
        found = _candidate(Path(lib_dir), "explicit")
        if found is None:
            raise QnnError(
                f"QNN libraries not found in {lib_dir}: expected {BACKEND_LIB} and {SYSTEM_LIB} there; {_HOW_TO_GET}"
            )
        return found
    sdk_root = os.environ.get("QNN_SDK_ROOT")
    if sdk_root:
        found = _candidate(Path(sdk_root) / SDK_LIB_SUBDIR, "QNN_SDK_ROOT")
        if found is None:
            raise QnnError(
                f"QNN_SDK_ROOT={sdk_root} has no {BACKEND_LIB} and {SYSTEM_LIB} in "
                f"{Path(sdk_root) / SDK_LIB_SUBDIR}; point QNN_SDK_ROOT at a QNN SDK install or unset it "
                f"to use the `onnxruntime-qnn` package"
            )
        return found
    pkg = _onnxruntime_qnn_dir()
    if pkg is not None:
        found = _candidate(pkg, "onnxruntime_qnn")
        if found is not None:
            return found
    raise QnnError(f"no QNN libraries found (QNN_SDK_ROOT unset, onnxruntime_qnn absent or incomplete); {_HOW_TO_GET}")


@dataclass(frozen=True)
class QnnVersion:
    """Versions reported by the loaded libraries, for manifests."""

    build_id: str  # backendGetBuildId, e.g. "v2.51.0.260929181845"
    core_api: tuple[int, int, int]  # QNN core API of the provider, e.g. (2, 40, 0)
    backend_api: tuple[int, int, int]  # HTP backend API, e.g. (5, 51, 0)
    system_api: tuple[int, int, int]
    provider: str  # e.g. "HTP_QTI_AISW"
    lib_source: str
    lib_dir: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "build_id": self.build_id,
            "core_api": ".".join(map(str, self.core_api)),
            "backend_api": ".".join(map(str, self.backend_api)),
            "system_api": ".".join(map(str, self.system_api)),
            "provider": self.provider,
            "lib_source": self.lib_source,
            "lib_dir": self.lib_dir,
        }


CHECKED_CORE_API = ((2, 40), (2, 40))
"""The QNN core API range (major, minor), both ends included, that the cffi declarations (``_cdefs.py``) were
checked against: the libraries of onnxruntime-qnn 2.7. Struct layouts differ between API releases (the HTP
device config union moved between 2.32 and 2.40), so another release is refused rather than misread."""


def check_core_api(version: QnnVersion, backend: Path) -> None:
    """One line (a `QnnError`) naming the loaded build when its core API is outside :data:`CHECKED_CORE_API`."""
    (lo, hi), api = CHECKED_CORE_API, version.core_api[:2]
    if lo <= api <= hi:
        return
    span = f"{lo[0]}.{lo[1]}" if lo == hi else f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"
    raise QnnError(
        f"{backend}: QNN build {version.build_id} (core API {'.'.join(map(str, version.core_api))}, from "
        f"{version.lib_source}) is outside the QNN core API {span} mnnbuild's C API declarations were checked "
        "against; install onnxruntime-qnn>=2.7,<2.8 or set QNN_SDK_ROOT to an SDK with that API"
    )


def _ver(v: Any) -> tuple[int, int, int]:
    return (int(v.major), int(v.minor), int(v.patch))


class QnnLibrary:
    """The HTP backend and QnnSystem libraries loaded through one cffi FFI.

    Holds no QNN handles itself (sessions own those), so it needs no closing; the shared
    libraries stay loaded for the life of the process, since unloading a library that has
    started threads is not safe.
    """

    def __init__(self, lib_dir: str | os.PathLike[str] | None = None, *, log_level: int | None = None) -> None:
        self.paths = find_qnn_libraries(lib_dir)
        # one precompiled FFI for every library (its type tables are read-only): nothing is parsed at run time
        self.ffi = QNN_FFI
        with native_output(f"QNN ({self.paths.lib_dir})"):  # the HTP library prints its thread-local setup
            try:
                self._backend_lib = self.ffi.dlopen(str(self.paths.backend))
                self._system_lib = self.ffi.dlopen(str(self.paths.system))
                self._libc = self.ffi.dlopen(None)
            except OSError as exc:
                raise QnnError(f"cannot load QNN libraries from {self.paths.lib_dir}: {exc}; {_HOW_TO_GET}") from exc
            self._provider = self._get_provider()
        self.iface = self._provider.table
        self._sys_provider = self._get_system_provider()
        self.sys_iface = self._sys_provider.table
        self.log_level = log_level if log_level is not None else self._default_log_level()
        # Error-level QNN messages seen during the current checked call; appended to QnnError.
        self._captured: collections.deque[str] = collections.deque(maxlen=40)
        self._capture_lock = threading.Lock()
        # Keep the callback object alive as long as this library: QNN holds a raw pointer to it.
        self._log_cb = self.ffi.callback("QnnLog_Callback_t", self._on_log)
        self.version = self._read_version()
        check_core_api(self.version, self.paths.backend)
        log.debug("loaded QNN %s from %s (%s)", self.version.build_id, self.paths.lib_dir, self.paths.source)

    # -- discovery of interfaces -------------------------------------------------------------
    def _get_provider(self) -> Any:
        providers = self.ffi.new("const QnnInterface_t***")
        count = self.ffi.new("uint32_t*")
        status = self._backend_lib.QnnInterface_getProviders(providers, count)
        if status != QNN_SUCCESS or count[0] == 0:
            raise QnnError(f"QnnInterface_getProviders failed in {self.paths.backend} (status {status})")
        for i in range(count[0]):
            p = providers[0][i]
            if p.backendId == HTP_BACKEND_ID and p.apiVersion.coreApiVersion.major == 2:
                return p
        raise QnnError(f"{self.paths.backend} offers no HTP provider with QNN core API 2.x")

    def _get_system_provider(self) -> Any:
        providers = self.ffi.new("const QnnSystemInterface_t***")
        count = self.ffi.new("uint32_t*")
        status = self._system_lib.QnnSystemInterface_getProviders(providers, count)
        if status != QNN_SUCCESS or count[0] == 0:
            raise QnnError(f"QnnSystemInterface_getProviders failed in {self.paths.system} (status {status})")
        for i in range(count[0]):
            p = providers[0][i]
            if p.systemApiVersion.major == 1:
                return p
        raise QnnError(f"{self.paths.system} offers no QnnSystem provider with API 1.x")

    def _read_version(self) -> QnnVersion:
        build = self.ffi.new("const char**")
        self.check(self.iface.backendGetBuildId(build), "backendGetBuildId")
        return QnnVersion(
            build_id=self.ffi.string(build[0]).decode(),
            core_api=_ver(self._provider.apiVersion.coreApiVersion),
            backend_api=_ver(self._provider.apiVersion.backendApiVersion),
            system_api=_ver(self._sys_provider.systemApiVersion),
            provider=self.ffi.string(self._provider.providerName).decode(),
            lib_source=self.paths.source,
            lib_dir=str(self.paths.lib_dir),
        )

    # -- logging -------------------------------------------------------------------------------
    @staticmethod
    def _default_log_level() -> int:
        if qnn_log.isEnabledFor(logging.DEBUG):
            return LOG_VERBOSE
        if qnn_log.isEnabledFor(logging.INFO):
            return LOG_INFO
        return LOG_WARN

    def _on_log(self, fmt: Any, level: int, timestamp: int, args: Any) -> None:
        # Runs on QNN's threads; must never raise into C.
        try:
            buf = self.ffi.new("char[]", 2048)
            self._libc.vsnprintf(buf, 2048, fmt, args)
            msg = self.ffi.string(buf).decode("utf-8", "replace").strip()
            if level == LOG_ERROR and any(b in msg for b in _BENIGN_ERRORS):
                level = LOG_DEBUG
            qnn_log.log(_QNN_TO_PY_LEVEL.get(level, logging.DEBUG), "%s", msg)
            if level == LOG_ERROR:
                with self._capture_lock:
                    self._captured.append(msg)
        except Exception:  # a logging failure must never propagate into C
            pass

    def create_log(self) -> Any:
        """A new QNN log handle wired to Python logging; the caller frees it with ``iface.logFree``."""
        handle = self.ffi.new("Qnn_LogHandle_t*")
        self.check(self.iface.logCreate(self._log_cb, self.log_level, handle), "logCreate")
        return handle[0]

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Start a fresh window of captured QNN error messages (used around checked calls)."""
        with self._capture_lock:
            self._captured.clear()
        yield

    def captured_errors(self) -> list[str]:
        with self._capture_lock:
            return list(self._captured)

    # -- errors --------------------------------------------------------------------------------
    def error_message(self, status: int) -> str:
        msg = self.ffi.new("const char**")
        try:
            if self.iface.errorGetMessage(status, msg) == QNN_SUCCESS and msg[0] != self.ffi.NULL:
                return self.ffi.string(msg[0]).decode("utf-8", "replace")
        except Exception:  # best effort: the code alone is still reported
            pass
        return ""

    def check(self, status: int, what: str) -> None:
        """Raise :class:`QnnError` naming ``what``, the code, QNN's message and its logged errors."""
        if status == QNN_SUCCESS:
            return
        code = int(status) & 0xFFFF
        parts = [f"QNN {what} failed with error {code}"]
        text = self.error_message(status)
        if text:
            parts.append(f"({text})")
        logged = self.captured_errors()
        if logged:
            parts.append("; QNN said: " + " | ".join(logged[-8:]))
        raise QnnError(" ".join(parts))

    def call(self, what: str, fn: Callable[..., int], *args: Any, native: bool = False) -> None:
        """Call a QNN function and :meth:`check` it, with a fresh window of captured errors; ``native``: what the
        library prints meanwhile is captured too (`native_output`: for the calls that load or run graphs, not the
        thousands that add a tensor or node)."""
        with self.capturing(), native_output(f"QNN {what}") if native else contextlib.nullcontext():
            status = fn(*args)
            self.check(status, what)
