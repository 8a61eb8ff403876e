"""The SoCs mnnbuild can build for: QNN SoC model id, Hexagon DSP arch and VTCM size.

The rows are data (from DESIGN.md, section 2). A model spec names targets by DSP arch
(``v79``); each arch has a default SoC that the spec may override with another SoC of
the same arch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Soc(BaseModel):
    """One Snapdragon SoC as QNN's HTP backend knows it."""

    model_config = ConfigDict(frozen=True)

    name: str
    soc_id: int
    dsp_arch: str
    vtcm_mb: int = 8

    @property
    def arch_number(self) -> int:
        """The numeric HTP arch QNN expects (``v79`` -> 79)."""
        return int(self.dsp_arch.removeprefix("v"))


SOCS: tuple[Soc, ...] = (
    Soc(name="SM8450", soc_id=36, dsp_arch="v69"),
    Soc(name="SM8475", soc_id=42, dsp_arch="v69"),
    Soc(name="SM8550", soc_id=43, dsp_arch="v73"),
    Soc(name="SM8635", soc_id=68, dsp_arch="v73"),
    Soc(name="SM8650", soc_id=57, dsp_arch="v75"),
    Soc(name="SM8750", soc_id=69, dsp_arch="v79"),
    Soc(name="SM8735", soc_id=85, dsp_arch="v79"),
    Soc(name="SM8850", soc_id=87, dsp_arch="v81"),
)

# The flagship of each arch: what a phone with that NPU most likely is.
DEFAULT_SOC: dict[str, str] = {
    "v69": "SM8450",
    "v73": "SM8550",
    "v75": "SM8650",
    "v79": "SM8750",
    "v81": "SM8850",
}


def known_archs() -> list[str]:
    """DSP arch names that have a default SoC, in table order."""
    return list(DEFAULT_SOC)


def soc_by_name(name: str) -> Soc:
    """Look a SoC up by name (``SM8750``); raises ``KeyError`` with the known names."""
    for soc in SOCS:
        if soc.name == name.upper():
            return soc
    raise KeyError(f"unknown SoC {name!r}; known: {', '.join(s.name for s in SOCS)}")


def soc_for_arch(arch: str, override: str | None = None) -> Soc:
    """The SoC to build for a DSP arch: ``override`` if given (must be of that arch), else the default."""
    if arch not in DEFAULT_SOC:
        raise KeyError(f"unknown DSP arch {arch!r}; known: {', '.join(DEFAULT_SOC)}")
    soc = soc_by_name(override or DEFAULT_SOC[arch])
    if soc.dsp_arch != arch:
        raise KeyError(f"SoC {soc.name} is {soc.dsp_arch}, not {arch}")
    return soc
