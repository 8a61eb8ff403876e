"""The page report of a verified bundle: its data (:mod:`data`), figures (:mod:`figures`) and HTML
(:mod:`render`, imported only where a page is drawn: it loads Jinja2 and matplotlib).

Knows nothing about stages or doit: the report stage gathers the data from the stage dirs and writes the page.
"""

from mnnbuild.report.data import OpCell, ReportData, StageCost
from mnnbuild.report.template import renderer_fingerprint

__all__ = ["OpCell", "ReportData", "StageCost", "renderer_fingerprint"]
