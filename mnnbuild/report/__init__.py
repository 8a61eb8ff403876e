"""The page report of a verified bundle: its data (:mod:`data`), figures (:mod:`figures`) and HTML (:mod:`render`).

Knows nothing about stages or doit: the report stage gathers the data from the stage dirs and writes the page.
"""

from mnnbuild.report.data import OpCell, ReportData, StageCost
from mnnbuild.report.render import render_html, renderer_fingerprint

__all__ = ["OpCell", "ReportData", "StageCost", "render_html", "renderer_fingerprint"]
