"""The report's figures: SVG text drawn by :mod:`svg`, inlined into the page (no files, no network).

Each function takes plain data and returns one ``<svg>`` element without a fixed size (its viewBox keeps the aspect
ratio; the page's CSS makes it as wide as the screen). The output is deterministic: no date, and ids numbered under
a fixed salt per figure, so an unchanged report is byte-identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mnnbuild.report.data import CPU, OpCell, runs
from mnnbuild.report.svg import (
    FONT,
    PAD,
    SMALL,
    TICK,
    WIDTH,
    Axes,
    Canvas,
    Key,
    Scale,
    legend,
    legend_height,
    linear,
    log10_scale,
    rows,
    text_width,
)

CPU_COLOR = "#9e9e9e"
PASS_COLOR = "#2e7d32"
FAIL_COLOR = "#c62828"
DECODE_COLOR = "#1565c0"
PREFILL_COLOR = "#ef6c00"
TAB10 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
"""Tableau's tab10 and tab20 qualitative palettes, as the figures always colored plugins."""
TAB20 = (
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd", "#c5b0d5",
    "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
)  # fmt: skip
RIGHT = 14.0
"""The right margin (room for the last x tick label's second half)."""
TITLE_H = FONT + 2 * PAD
XTICKS_H = TICK + PAD + FONT + PAD
XLABEL_H = FONT + 2 * PAD
HEADROOM = 1.05
"""Above the tolerance: its line stays clear of the top of the frame."""


def plugin_colors(plugins: Sequence[str]) -> dict[str, str]:
    palette = TAB10 if len(plugins) <= 10 else TAB20
    colors = {p: palette[i % len(palette)] for i, p in enumerate(plugins)}
    return {CPU: CPU_COLOR, **colors}


def _label_margin(labels: Sequence[str], size: float) -> float:
    """The room left of a plot for its row labels (a long one is shortened to fit: at most 45% of the width)."""
    widest = max((text_width(s, size) for s in labels), default=0.0)
    return min(8 + widest + TICK + PAD, WIDTH * 0.45)


def _tick_margin(scale: Scale, size: float = FONT) -> float:
    return 8 + max((text_width(s, size) for s in scale.labels), default=0.0) + TICK + PAD


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def partition_strip(cells: Sequence[OpCell], plugins: Sequence[str]) -> str:
    """The model's ops in order as one strip, colored CPU vs each plugin."""
    colors = plugin_colors(plugins)
    c = Canvas("partition-strip")
    left, top = 14.0, 6.0
    ax = Axes(c, left, top, WIDTH - 2 * left, 40, linear(0, max(len(cells), 1), snap=False, integer=True), Scale(0, 1))
    with ax.data():
        for start, length, where in runs(list(cells)):
            x0, x1 = ax.px(start), ax.px(start + length)
            c.rect(x0, ax.y, x1 - x0, ax.h, colors.get(where, CPU_COLOR), "white", 0.3)
    ax.frame("b")
    ax.xticks()
    ax.xlabel(f"{len(cells)} ops in source order")
    y = top + ax.h + XTICKS_H + XLABEL_H + 4
    keys = [Key(k, colors[k]) for k in [CPU, *plugins]]
    return c.svg(y + legend(c, keys, left, y, ax.w, max_cols=6) + 4)


def plugin_sizes(plugins: Sequence[str], weight_bytes: Sequence[int], binary_bytes: Sequence[int]) -> str:
    """Per plugin: its weights in the source model and its shipped context binary, in MiB."""
    c = Canvas("plugin-sizes")
    weights = [b / 2**20 for b in weight_bytes]
    binaries = [b / 2**20 for b in binary_bytes]
    keys = [Key("weights (source model)", TAB10[0]), Key("context binary (shipped)", TAB10[1])]
    left = _label_margin(plugins, FONT)
    width = WIDTH - left - RIGHT
    top = 4 + legend_height(keys, width) + 2  # the legend above the axes, never over a bar
    ax = Axes(
        c, left, top, width, 25 * max(len(plugins), 1), linear(0, max([*weights, *binaries, 0.0])), rows(len(plugins))
    )
    legend(c, keys, left, 4, width, center=False)
    with ax.data():
        for i, (w, b) in enumerate(zip(weights, binaries, strict=True)):
            ax.hbar(i + 0.2, w, TAB10[0], 0.4)
            ax.hbar(i - 0.2, b, TAB10[1], 0.4)
    ax.frame()
    ax.categories(plugins)
    ax.xticks()
    ax.xlabel("MiB")
    return c.svg(top + ax.h + XTICKS_H + XLABEL_H + 4)


def graph_errors(
    labels: Sequence[str],
    prefill: Sequence[bool],
    rel_err: Sequence[float | None],
    cosine: Sequence[float | None],
    max_rel_err: float,
    min_cosine: float,
) -> str:
    """(a) every graph output by name: relative max abs error and 1 - cosine, decode and prefill graphs apart.

    Log axes: an exact 0 is drawn at the axis' left edge as a hollow marker ("0"), and a value the check could not
    compute (None) is not drawn at all: its row says "n/a" (it must not look like a perfect result)."""
    c = Canvas("graph-errors")
    n = len(labels)
    colors = [PREFILL_COLOR if p else DECODE_COLOR for p in prefill]
    left = _label_margin(labels, SMALL)
    gap = 36.0  # the panels' end labels (10⁻¹ | 10⁻¹⁸) stay apart
    width = (WIDTH - left - RIGHT - gap) / 2
    top = TITLE_H + 4
    panels = (
        (rel_err, max_rel_err, "max abs error / reference max abs"),
        ([None if v is None else 1 - v for v in cosine], 1 - min_cosine, "1 - cosine"),
    )
    height = 14.4 * max(n, 1)
    for k, (values, limit, title) in enumerate(panels):
        positive = [v for v in _finite(values) if v > 0]
        marks = [*positive, limit] if limit > 0 else positive
        # a decade below the smallest value: the zeros at the left edge stand apart from every measured value
        xs = log10_scale(
            min(marks, default=1e-8) / 10, max(marks, default=1e-8), max_ticks=int(width // 36)
        )  # a label is 4-5 characters
        ax = Axes(c, left + k * (width + gap), top, width, height, xs, rows(n))
        ax.categories(labels if k == 0 else None, SMALL, grid=True)
        with ax.data():
            if limit > 0:
                ax.vline(limit, FAIL_COLOR)
            for i, v in enumerate(values):
                y = ax.py(i)
                if v is None or not math.isfinite(v):  # not computed: a word, never a point
                    c.text(ax.x + 4, y, "n/a", SMALL, color=CPU_COLOR)
                elif v > 0:
                    c.circle(ax.px(v), y, 2.5, colors[i])
                else:
                    c.circle(ax.x + 4, y, 2.5, colors[i], hollow=True)
        ax.frame()
        ax.xticks()
        ax.title(title)
    keys = [
        Key("decode graph", DECODE_COLOR),
        Key("prefill graph", PREFILL_COLOR),
        Key("0 (exact)", CPU_COLOR, "hollow"),
        *([Key(f"tolerance {max_rel_err:.0%}", FAIL_COLOR, "dash")] if max_rel_err > 0 else []),
        *([Key(f"cosine {min_cosine}", FAIL_COLOR, "dash")] if min_cosine < 1 else []),
    ]
    y = top + height + XTICKS_H + 6
    return c.svg(y + legend(c, keys, 0, y, WIDTH, SMALL) + 4)


def position_errors(seq_len: int, rel_err: Sequence[float], cosine: Sequence[float | None], max_rel_err: float) -> str:
    """(b) the whole model's logits error per position of the prefill chunk."""
    c = Canvas("position-errors")
    one_minus = [1 - v if v is not None else 0.0 for v in cosine]
    xs = linear(0, max(len(rel_err) - 1, 1), snap=False, integer=True, target=8)
    y_err = linear(0, HEADROOM * max([*_finite(rel_err), max_rel_err]))
    y_cos = linear(0, max(_finite(one_minus), default=0.0))
    gap = 24.0
    m_err, m_cos = _tick_margin(y_err), _tick_margin(y_cos)
    width = (WIDTH - m_err - m_cos - gap - RIGHT) / 2
    top, height = TITLE_H + 4, 140.0
    ax_err = Axes(c, m_err, top, width, height, xs, y_err)
    ax_cos = Axes(
        c,
        m_err + width + gap + m_cos,
        top,
        width,
        height,
        linear(0, max(len(cosine) - 1, 1), snap=False, integer=True, target=8),
        y_cos,
    )
    with ax_err.data():
        ax_err.hline(max_rel_err, FAIL_COLOR)
        ax_err.plot(range(len(rel_err)), rel_err, PREFILL_COLOR)
    with ax_cos.data():
        ax_cos.plot(range(len(one_minus)), one_minus, DECODE_COLOR)
    for ax, title in (
        (ax_err, f"logits: max abs error / row max abs (seq {seq_len})"),
        (ax_cos, "logits: 1 - cosine per position"),
    ):
        ax.frame()
        ax.xticks()
        ax.yticks()
        ax.xlabel("position in the chunk")
        ax.title(title)
    y = top + height + XTICKS_H + XLABEL_H + 2
    keys = [Key(f"tolerance {max_rel_err:.0%}", FAIL_COLOR, "dash")]
    return c.svg(y + legend(c, keys, ax_err.x, y, ax_err.w, SMALL) + 4)


def generation_steps(rel_err: Sequence[float | None], agree: Sequence[bool], max_rel_err: float) -> str:
    """(c) each greedy step's logits error, bars colored by whether the tokens agree."""
    c = Canvas("generation-steps")
    n = len(rel_err)
    ys = linear(0, HEADROOM * max([*_finite(rel_err), max_rel_err]))
    xs = linear(-0.5, max(n, 1) - 0.5, snap=False, integer=True, target=10)
    left = _tick_margin(ys)
    top = TITLE_H + 4
    ax = Axes(c, left, top, WIDTH - left - RIGHT, 120, xs, ys)
    with ax.data():
        for i, (v, same) in enumerate(zip(rel_err, agree, strict=True)):
            if v is None or not math.isfinite(v):  # not computed: said, not drawn as a zero bar
                c.text(ax.px(i), ax.py(0) - SMALL, "n/a", SMALL, "middle", CPU_COLOR)
            else:
                ax.vbar(i, v, PASS_COLOR if same else FAIL_COLOR)
        ax.hline(max_rel_err, FAIL_COLOR)
    ax.frame()
    ax.xticks()
    ax.yticks()
    ax.xlabel("new token")
    ax.title("logits max abs error / reference max abs per greedy step (red: tokens differ)")
    y = top + ax.h + XTICKS_H + XLABEL_H + 2
    keys = [
        Key("tokens agree", PASS_COLOR),
        Key("tokens differ", FAIL_COLOR),
        Key(f"tolerance {max_rel_err:.0%}", FAIL_COLOR, "dash"),
    ]
    return c.svg(y + legend(c, keys, ax.x, y, ax.w, SMALL) + 4)


def _bar_panels(
    salt: str, labels: Sequence[str], size: float, panels: Sequence[tuple[Sequence[float], str, str, str]]
) -> str:
    """Horizontal bars, one row per label, in one or more panels side by side that share the rows (labels at the
    left of the first); each panel is (values, color, title, x label)."""
    c = Canvas(salt)
    left = _label_margin(labels, size)
    gap = 24.0
    width = (WIDTH - left - RIGHT - gap * (len(panels) - 1)) / len(panels)
    top = TITLE_H + 4
    height = 21.6 * max(len(labels), 1)
    for k, (values, color, title, xlabel) in enumerate(panels):
        ax = Axes(
            c,
            left + k * (width + gap),
            top,
            width,
            height,
            linear(0, max(_finite(values), default=0.0)),
            rows(len(labels)),
        )
        with ax.data():
            for i, v in enumerate(values):
                ax.hbar(i, v, color)
        ax.frame()
        ax.categories(labels if k == 0 else None, size)
        ax.xticks()
        ax.xlabel(xlabel)
        ax.title(title)
    return c.svg(top + height + XTICKS_H + XLABEL_H + 4)


def stage_costs(labels: Sequence[str], seconds: Sequence[float], peak_mib: Sequence[float]) -> str:
    """Wall time and peak RSS of each stage run."""
    return _bar_panels(
        "stage-costs",
        labels,
        FONT,
        [
            (seconds, DECODE_COLOR, "wall time per stage", "wall time (s)"),
            (peak_mib, PREFILL_COLOR, "peak RSS per stage", "peak RSS (MiB)"),
        ],
    )


def file_sizes(paths: Sequence[str], sizes: Sequence[int]) -> str:
    """The bundle's largest files, in MiB."""
    return _bar_panels(
        "bundle-files",
        paths,
        SMALL,
        [([s / 2**20 for s in sizes], DECODE_COLOR, f"the bundle's {len(paths)} largest files", "MiB")],
    )
