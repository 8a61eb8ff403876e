"""The report's figures as drawn by our SVG writer: what a reader relies on, checked on the SVG itself."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest

from mnnbuild.report import figures
from mnnbuild.report.data import OpCell
from mnnbuild.report.svg import log10_scale

NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def circles(root: ET.Element) -> list[ET.Element]:
    return list(root.iter(f"{NS}circle"))


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text")]


def graph_errors(labels: list[str], rel: list[float | None], cos: list[float | None]) -> str:
    return figures.graph_errors(labels, [i % 2 == 1 for i in range(len(labels))], rel, cos, 0.02, 0.999)


FIGURES: dict[str, Callable[[], str]] = {
    "partition-strip": lambda: figures.partition_strip(
        [OpCell(index=i, name=f"op{i}", type="Conv", where="CPU" if i % 7 == 0 else "qnn/a.bin") for i in range(30)],
        ["qnn/a.bin"],
    ),
    "plugin-sizes": lambda: figures.plugin_sizes(["qnn/a.bin", "qnn/b.bin"], [2**20, 3 * 2**19], [2**21, 2**20]),
    "graph-errors": lambda: graph_errors(["g0 out", "g1 out"], [1e-3, 0.0], [0.99999, None]),
    "position-errors": lambda: figures.position_errors(4, [1e-3, 2e-3, 5e-4, 1e-3], [1.0, 0.9999, None, 0.99], 0.02),
    "generation-steps": lambda: figures.generation_steps([1e-3, None, 0.05], [True, True, False], 0.02),
    "stage-costs": lambda: figures.stage_costs(["io", "verify"], [0.5, 2.1], [85.0, 230.0]),
    "bundle-files": lambda: figures.file_sizes(["model/a.bin", "run.sh"], [3 * 2**20, 900]),
}


def test_zero_and_missing_on_a_log_axis_are_a_hollow_marker_and_n_a() -> None:
    """Row 0 measured, row 1 exactly 0, row 2 not computed: per panel one filled dot, one ring at the left edge and
    one "n/a"; the missing value gets no marker of any kind."""
    svg = graph_errors(["measured", "exact", "missing"], [1e-3, 0.0, None], [0.9999, 1.0, None])
    root = parse(svg)
    filled = [c for c in circles(root) if c.get("fill") != "none"]
    hollow = [c for c in circles(root) if c.get("fill") == "none"]
    legend_rings = 1  # the "0 (exact)" key
    assert len(filled) == 2, "one measured value per panel"
    assert len(hollow) == 2 + legend_rings
    assert texts(root).count("n/a") == 2
    # the rings sit on the exact row, left of the measured dot of the same panel, at the panel's left edge
    rows_y = {float(c.get("cy", "nan")) for c in filled}
    rings = sorted(hollow, key=lambda c: float(c.get("cy", "nan")))[:2]  # the legend's ring is below the panels
    assert all(float(r.get("cy", "nan")) not in rows_y for r in rings), "the zero is on its own row"
    frames = sorted(float(x) for x in re.findall(r'<clipPath id="[^"]+"><rect x="([\d.]+)"', svg))
    for ring, dot, left in zip(
        sorted(rings, key=lambda c: float(c.get("cx", "nan"))),
        sorted(filled, key=lambda c: float(c.get("cx", "nan"))),
        frames,
        strict=True,
    ):
        assert float(ring.get("cx", "nan")) - left < 8, "a zero is drawn at the axis' left edge"
        assert float(ring.get("cx", "nan")) < float(dot.get("cx", "nan"))


@pytest.mark.parametrize(
    ("lo", "hi"), [(3e-9, 0.02), (1e-17, 1e-3), (2e-4, 3e-4), (0.5, 700.0), (1e-3, 1e-3), (1e-300, 1e300)]
)
def test_log_ticks_span_the_data(lo: float, hi: float) -> None:
    scale = log10_scale(lo, hi, max_ticks=6)
    assert scale.ticks[0] <= lo and scale.ticks[-1] >= hi
    assert (scale.lo, scale.hi) == (scale.ticks[0], scale.ticks[-1])
    assert 2 <= len(scale.ticks) <= 6
    exponents = [math.log10(t) for t in scale.ticks]
    assert all(abs(e - round(e)) < 1e-9 for e in exponents), "ticks at decades"
    steps = {round(b - a) for a, b in zip(exponents, exponents[1:], strict=False)}
    assert len(steps) == 1 and steps.pop() >= 1, "evenly spaced, increasing"
    assert all(0 <= scale.frac(v) <= 1 for v in (lo, hi))


def test_graph_errors_ticks_cover_every_value() -> None:
    rel = [3e-9, 4e-4, 0.015]
    root = parse(graph_errors(["a", "b", "c"], rel, [0.999999999, 0.9999, 0.9995]))
    labels = [t for t in texts(root) if t.startswith("10")]
    exponents = [int(t[2:].replace("⁻", "-").translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789"))) for t in labels]
    assert min(exponents) <= math.floor(math.log10(3e-9)) and max(exponents) >= math.ceil(math.log10(0.02))


def test_text_from_model_files_is_escaped() -> None:
    label = 'g0 <&> "x"'
    for svg in (
        graph_errors([label], [1e-3], [0.9999]),
        figures.file_sizes([label], [1000]),
        figures.plugin_sizes([label], [10], [20]),
    ):
        assert "<&>" not in svg
        assert label in texts(parse(svg))


def test_the_same_data_gives_the_same_bytes() -> None:
    for draw in FIGURES.values():
        assert draw() == draw()


@pytest.mark.parametrize("salt", sorted(FIGURES))
def test_each_figure_is_one_sized_by_the_page_svg(salt: str) -> None:
    svg = FIGURES[salt]()
    root = parse(svg)
    assert root.tag == f"{NS}svg" and svg.startswith('<svg role="img"') and svg.rstrip().endswith("</svg>")
    assert svg.count("<svg") == 1
    assert root.get("role") == "img" and root.get("aria-label") == salt and root.get("class") == "figure"
    assert root.get("width") is None and root.get("height") is None
    x, y, w, h = (float(v) for v in (root.get("viewBox") or "").split())
    assert (x, y) == (0, 0) and w > 0 and h > 0
    ids = [e.get("id") for e in root.iter() if e.get("id")]
    assert ids and all(i.startswith(f"{salt}-") for i in ids) and len(set(ids)) == len(ids)
    refs = re.findall(r"url\(#([^)]+)\)", svg)
    assert refs and set(refs) <= set(ids)
    for t in root.iter(f"{NS}text"):  # every text inside the figure's box
        assert 0 <= float(t.get("x", "nan")) <= w and 0 <= float(t.get("y", "nan")) <= h
    assert root.get("font-family") == "sans-serif"


def test_plugin_colors_are_the_fixed_palettes() -> None:
    ten = figures.plugin_colors([f"p{i}" for i in range(10)])
    assert ten["CPU"] == figures.CPU_COLOR and ten["p0"] == "#1f77b4" and ten["p9"] == "#17becf"
    twelve = figures.plugin_colors([f"p{i}" for i in range(12)])
    assert twelve["p1"] == "#aec7e8" and len(set(twelve.values())) == 13
    many = figures.plugin_colors([f"p{i}" for i in range(25)])
    assert many["p20"] == many["p0"]
