"""The page report of a verified bundle: its data (:mod:`data`), figures (:mod:`figures`) and HTML
(:mod:`render`, imported only where a page is drawn: it loads Jinja2; the figures are SVG written by
:mod:`svg`).

Knows nothing about stages or doit: the report stage gathers the data from the stage dirs and writes the page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mnnbuild.report.template import renderer_fingerprint

if TYPE_CHECKING:
    from mnnbuild.report.data import OpCell, ReportData, StageCost

__all__ = ["OpCell", "ReportData", "StageCost", "renderer_fingerprint"]


def __getattr__(name: str) -> Any:
    """The data's models, imported on first use: the report stage's key needs only `renderer_fingerprint`, and a doit
    start builds no verify report model."""
    if name not in ("OpCell", "ReportData", "StageCost"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from mnnbuild.report import data

    value = getattr(data, name)
    globals()[name] = value
    return value
