"""A QNN backend session: log handle + backend + (optionally) an HTP device for a target."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any

from mnnbuild.base.errors import QnnError
from mnnbuild.qnn.library import QnnLibrary

log = logging.getLogger(__name__)

# QnnDevice_ConfigOption_t / QnnHtpDevice_ConfigOption_t
DEVICE_CONFIG_CUSTOM = 0
HTP_DEVICE_SOC = 0
HTP_DEVICE_ARCH = 1

#: QNN SoC model ids of the phones mnnbuild targets (DESIGN.md), name -> (soc id, dsp arch).
#: Note: the API 2.40 library prepares soc 85 (SM8735) for v73, whatever ARCH says; see
#: BinaryInfo.check_target.
KNOWN_SOCS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "SM8450": (36, 69),
        "SM8475": (42, 69),
        "SM8550": (43, 73),
        "SM8635": (68, 73),
        "SM8650": (57, 75),
        "SM8750": (69, 79),
        "SM8735": (85, 79),
        "SM8850": (87, 81),
    }
)
SUPPORTED_ARCHS = (68, 69, 73, 75, 79, 81)


@dataclass(frozen=True)
class HtpTarget:
    """What an HTP context binary is prepared for: QNN SoC model id, Hexagon arch, VTCM size."""

    soc_id: int
    dsp_arch: int
    vtcm_mb: int = 8

    def __post_init__(self) -> None:
        if self.dsp_arch not in SUPPORTED_ARCHS:
            raise QnnError(f"unknown HTP dsp arch v{self.dsp_arch}; expected one of {list(SUPPORTED_ARCHS)}")
        if self.soc_id <= 0:
            raise QnnError(f"invalid QNN soc id {self.soc_id}; expected a QNN SoC model id such as 69 (SM8750)")
        if not 0 < self.vtcm_mb <= 64:
            raise QnnError(f"invalid VTCM size {self.vtcm_mb} MB; expected 1..64")

    @classmethod
    def for_soc(cls, name: str, vtcm_mb: int = 8) -> HtpTarget:
        """Target for a SoC name such as ``"SM8750"``."""
        try:
            soc_id, arch = KNOWN_SOCS[name.upper()]
        except KeyError:
            raise QnnError(f"unknown SoC {name!r}; known: {', '.join(sorted(KNOWN_SOCS))}") from None
        return cls(soc_id, arch, vtcm_mb)

    @property
    def soc_name(self) -> str | None:
        for name, (soc, _) in KNOWN_SOCS.items():
            if soc == self.soc_id:
                return name
        return None


class QnnSession:
    """Owns a log handle, a backend handle and, if asked, a device handle; frees them on close.

    ``target`` gives the device the HTP SOC and ARCH custom configs, which select what graphs are
    prepared for. ``device=False`` creates no device at all (contexts then use the default).
    """

    def __init__(self, lib: QnnLibrary, target: HtpTarget | None = None, *, device: bool = True) -> None:
        self.lib = lib
        self.ffi = lib.ffi
        self.target = target
        self.log_handle: Any = self.ffi.NULL
        self.backend: Any = self.ffi.NULL
        self.device: Any = self.ffi.NULL
        self._closed = False
        try:
            self.log_handle = lib.create_log()
            out = self.ffi.new("Qnn_BackendHandle_t*")
            lib.call("backendCreate", lib.iface.backendCreate, self.log_handle, self.ffi.NULL, out, native=True)
            self.backend = out[0]
            if device:
                self.device = self._create_device(target)
        except BaseException:
            self.close()
            raise

    def _create_device(self, target: HtpTarget | None) -> Any:
        ffi, lib = self.ffi, self.lib
        keep: list[Any] = []
        configs = ffi.NULL
        if target is not None:
            soc = ffi.new("QnnHtpDevice_CustomConfig_t*")
            soc.option = HTP_DEVICE_SOC
            soc.socModel = target.soc_id
            arch = ffi.new("QnnHtpDevice_CustomConfig_t*")
            arch.option = HTP_DEVICE_ARCH
            arch.arch.deviceId = 0
            arch.arch.arch = target.dsp_arch
            wrapped = ffi.new("QnnDevice_Config_t[2]")
            # ARCH before SOC: given SOC first, the 2.40 library warns and drops the ARCH config.
            for i, custom in enumerate((arch, soc)):
                wrapped[i].option = DEVICE_CONFIG_CUSTOM
                wrapped[i].customConfig = custom
            configs = ffi.new("const QnnDevice_Config_t*[3]", [wrapped + 0, wrapped + 1, ffi.NULL])
            keep += [soc, arch, wrapped]
        out = ffi.new("Qnn_DeviceHandle_t*")
        what = f"deviceCreate (soc {target.soc_id}, v{target.dsp_arch})" if target else "deviceCreate"
        lib.call(what, lib.iface.deviceCreate, self.log_handle, configs, out, native=True)
        del keep
        return out[0]

    def close(self) -> None:
        """Free device, backend and log handle (in that order); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        iface, ffi = self.lib.iface, self.ffi
        if self.device != ffi.NULL:
            status = iface.deviceFree(self.device)
            if status:
                log.warning("QNN deviceFree failed with error %d", status & 0xFFFF)
            self.device = ffi.NULL
        if self.backend != ffi.NULL:
            status = iface.backendFree(self.backend)
            if status:
                log.warning("QNN backendFree failed with error %d", status & 0xFFFF)
            self.backend = ffi.NULL
        if self.log_handle != ffi.NULL:
            iface.logFree(self.log_handle)
            self.log_handle = ffi.NULL

    def __enter__(self) -> QnnSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def free_context(lib: QnnLibrary, context: Any) -> None:
    """Free a QNN context on a close path: a failure is logged, never raised over the original error."""
    if context == lib.ffi.NULL:
        return
    status = lib.iface.contextFree(context, lib.ffi.NULL)
    if status:
        log.warning("QNN contextFree failed with error %d", status & 0xFFFF)
