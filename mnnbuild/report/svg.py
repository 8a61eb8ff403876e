"""A small SVG writer for the report's figures: scales, axes, marks, text and legends, as plain strings.

Coordinates are viewBox units (a figure is :data:`WIDTH` wide; the page's CSS scales it to the screen). Text widths
are estimated from the character count (:func:`text_width`): no font metrics, so margins are generous rather than
exact. Everything is deterministic: numbers are written with fixed precision and ids are numbered from the figure's
salt, so the same data gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

WIDTH = 720.0
"""Every figure's viewBox width (10 in at 72 units per inch: the figures keep their former size)."""
FONT = 11.0
SMALL = 9.5
CHAR_EM = 0.6
"""Estimated advance of one character, in em: a little wide for sans-serif lowercase, so labels fit."""
INK = "#222222"
MUTED = "#5f6368"
GRID = "#eeeeee"
TICK = 3.5
PAD = 3.0
_EPS = 1e-9
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def num(v: float) -> str:
    """A coordinate: two decimals at most, no trailing zeros, never ``-0``."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def text_width(text: str, size: float = FONT) -> float:
    return len(text) * CHAR_EM * size


def attr(value: str) -> str:
    """An attribute value, quoted and escaped (labels come from model files)."""
    return quoteattr(value)


@dataclass(frozen=True)
class Scale:
    """Data -> fraction of the axis (0 at ``lo``, 1 at ``hi``; ``lo > hi`` runs the axis backwards), and its ticks."""

    lo: float
    hi: float
    log: bool = False
    ticks: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()

    def frac(self, v: float) -> float:
        if self.log:
            lo, hi = math.log10(self.lo), math.log10(self.hi)
            return (math.log10(v) - lo) / (hi - lo)
        return (v - self.lo) / (self.hi - self.lo)

    def contains(self, v: float) -> bool:
        return math.isfinite(v) and (v > 0 or not self.log)


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at least ``raw``."""
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw * (1 - _EPS):
            return m * mag
    return 10 * mag


def _linear_label(v: float, step: float) -> str:
    if v == 0:
        return "0"
    if step < 1e-3 or step >= 1e5:  # plain decimals would be long: 2e-7, 1.5e6
        mantissa, exp = f"{v:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"
    decimals = max(0, -math.floor(math.log10(step) + _EPS))
    return f"{v:.{decimals}f}"


def linear(lo: float, hi: float, *, snap: bool = True, integer: bool = False, target: int = 6) -> Scale:
    """A linear scale over [lo, hi] with about ``target`` ticks at 1, 2, 5 x 10^k; ``snap`` widens the range to the
    ticks around it (the axis then starts and ends at a labeled value); ``integer`` ticks whole numbers only."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo <= 0:
        hi = lo + (abs(lo) or 1.0)
    step = _nice_step((hi - lo) / max(target - 1, 1))
    if integer:
        step = max(step, 1.0)
    if snap:
        lo = math.floor(lo / step + _EPS) * step
        hi = math.ceil(hi / step - _EPS) * step
    first, last = math.ceil(lo / step - _EPS), math.floor(hi / step + _EPS)
    ticks = tuple(round(k * step, 12) for k in range(first, last + 1))
    return Scale(lo, hi, ticks=ticks, labels=tuple(_linear_label(t, step) for t in ticks))


def decade_label(exponent: int) -> str:
    return "10" + str(exponent).translate(_SUPERSCRIPT)


def log10_scale(lo: float, hi: float, *, max_ticks: int = 8) -> Scale:
    """A log10 scale from the decade at or below ``lo`` to one at or above ``hi`` (both > 0), ticked at every decade
    or every few (at most ``max_ticks``, evenly): both ends are ticks, so the ticks span the data."""
    lo, hi = min(max(lo, 1e-300), 1e300), min(max(hi, 1e-300), 1e300)  # 10.0**d stays a float
    lo_dec = math.floor(math.log10(lo) + _EPS)
    hi_dec = max(math.ceil(math.log10(hi) - _EPS), lo_dec + 1)
    step = max(1, math.ceil((hi_dec - lo_dec) / max(max_ticks - 1, 1)))
    # evenly from the low end, the high end moved up onto the grid (at most step - 1 decades of room)
    hi_dec = lo_dec + math.ceil((hi_dec - lo_dec) / step) * step
    decades = range(lo_dec, hi_dec + 1, step)
    return Scale(
        10.0**lo_dec,
        10.0**hi_dec,
        log=True,
        ticks=tuple(10.0**d for d in decades),
        labels=tuple(decade_label(d) for d in decades),
    )


def rows(n: int) -> Scale:
    """Category rows 0..n-1 from the top down (a horizontal bar chart's y)."""
    n = max(n, 1)
    return Scale(n - 0.5, -0.5)


class Canvas:
    """One figure: elements appended in drawing order, ids numbered under the salt."""

    def __init__(self, salt: str, width: float = WIDTH) -> None:
        self.salt = salt
        self.width = width
        self._defs: list[str] = []
        self._body: list[str] = []

    def add(self, element: str) -> None:
        self._body.append(element)

    def new_id(self, kind: str) -> str:
        return f"{self.salt}-{kind}{len(self._defs) + 1}"

    def rect(self, x: float, y: float, w: float, h: float, fill: str, stroke: str | None = None, sw: float = 1) -> None:
        edge = f' stroke="{stroke}" stroke-width="{num(sw)}"' if stroke else ""
        self.add(f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" fill="{fill}"{edge}/>')

    def line(
        self, x1: float, y1: float, x2: float, y2: float, color: str = INK, width: float = 0.8, dash: str | None = None
    ) -> None:
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(
            f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
            f'stroke="{color}" stroke-width="{num(width)}"{dashed}/>'
        )

    def polyline(self, points: Sequence[tuple[float, float]], color: str, width: float = 1.2) -> None:
        if len(points) < 2:
            return
        coords = " ".join(f"{num(x)},{num(y)}" for x, y in points)
        self.add(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="{num(width)}" '
            'stroke-linejoin="round"/>'
        )

    def circle(self, cx: float, cy: float, r: float, color: str, hollow: bool = False) -> None:
        paint = f'fill="none" stroke="{color}" stroke-width="1"' if hollow else f'fill="{color}"'
        self.add(f'<circle cx="{num(cx)}" cy="{num(cy)}" r="{num(r)}" {paint}/>')

    def text(
        self,
        x: float,
        y: float,
        text: str,
        size: float = FONT,
        anchor: str = "start",
        color: str = INK,
        full: str | None = None,
    ) -> None:
        """``text`` centered vertically on ``y`` (baseline at about a third of the size below it); ``full`` is the
        untruncated text, shown as a tooltip."""
        tip = f"<title>{escape(full)}</title>" if full and full != text else ""
        fill = "" if color == INK else f' fill="{color}"'
        self.add(
            f'<text x="{num(x)}" y="{num(y + 0.35 * size)}" font-size="{num(size)}" '
            f'text-anchor="{anchor}"{fill}>{tip}{escape(text)}</text>'
        )

    @contextmanager
    def clipped(self, x: float, y: float, w: float, h: float) -> Iterator[None]:
        """What is drawn inside stays inside the box (a mark past the axis' range is cut at its edge)."""
        clip = self.new_id("clip")
        self._defs.append(
            f'<clipPath id="{clip}"><rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}"/></clipPath>'
        )
        self.add(f'<g clip-path="url(#{clip})">')
        try:
            yield
        finally:
            self.add("</g>")

    def svg(self, height: float) -> str:
        """The figure as an inline ``<svg>`` element: no XML prolog, no fixed width or height (the page's CSS sizes
        it), the salt as its accessible name."""
        head = (
            f'<svg role="img" aria-label={attr(self.salt)} class="figure" '
            f'viewBox="0 0 {num(self.width)} {num(height)}" xmlns="http://www.w3.org/2000/svg" '
            'font-family="sans-serif">'
        )
        defs = f"<defs>{''.join(self._defs)}</defs>" if self._defs else ""
        return "\n".join([head + defs, *self._body, "</svg>"])


def fit(text: str, width: float, size: float) -> str:
    """``text`` shortened in the middle with an ellipsis to about ``width``."""
    keep = int(width / (CHAR_EM * size))
    if len(text) <= keep or keep < 5:
        return text
    head = (keep - 1) // 2
    return text[:head] + "…" + text[len(text) - (keep - 1 - head) :]


class Axes:
    """A plot box at (x, y) of size (w, h) in the canvas, with an x and a y scale (y runs up)."""

    def __init__(self, canvas: Canvas, x: float, y: float, w: float, h: float, xs: Scale, ys: Scale) -> None:
        self.canvas, self.x, self.y, self.w, self.h, self.xs, self.ys = canvas, x, y, w, h, xs, ys

    def px(self, v: float) -> float:
        return self.x + self.w * self.xs.frac(v)

    def py(self, v: float) -> float:
        return self.y + self.h * (1 - self.ys.frac(v))

    @contextmanager
    def data(self) -> Iterator[None]:
        with self.canvas.clipped(self.x, self.y, self.w, self.h):
            yield

    def frame(self, sides: str = "lbtr") -> None:
        c, x0, y0, x1, y1 = self.canvas, self.x, self.y, self.x + self.w, self.y + self.h
        for side, (ax, ay, bx, by) in {
            "l": (x0, y0, x0, y1),
            "b": (x0, y1, x1, y1),
            "t": (x0, y0, x1, y0),
            "r": (x1, y0, x1, y1),
        }.items():
            if side in sides:
                c.line(ax, ay, bx, by)

    def xticks(self, size: float = FONT, labels: bool = True) -> None:
        base = self.y + self.h
        for t, label in zip(self.xs.ticks, self.xs.labels, strict=True):
            x = self.px(t)
            self.canvas.line(x, base, x, base + TICK)
            if labels:
                self.canvas.text(x, base + TICK + PAD + size / 2, label, size, "middle")

    def yticks(self, size: float = FONT, grid: bool = False) -> None:
        for t, label in zip(self.ys.ticks, self.ys.labels, strict=True):
            y = self.py(t)
            if grid:
                self.canvas.line(self.x, y, self.x + self.w, y, GRID, 0.5)
            self.canvas.line(self.x - TICK, y, self.x, y)
            self.canvas.text(self.x - TICK - PAD, y, label, size, "end")

    def categories(self, labels: Sequence[str] | None, size: float = FONT, grid: bool = False) -> None:
        """One tick per row; its label at the left unless ``labels`` is None (a panel sharing its neighbour's)."""
        room = self.x - TICK - PAD - 2
        n = len(labels) if labels is not None else round(abs(self.ys.lo - self.ys.hi))
        for i in range(n):
            y = self.py(i)
            if grid:
                self.canvas.line(self.x, y, self.x + self.w, y, GRID, 0.5)
            self.canvas.line(self.x - TICK, y, self.x, y)
            if labels is not None:
                self.canvas.text(self.x - TICK - PAD, y, fit(labels[i], room, size), size, "end", full=labels[i])

    def xlabel(self, text: str, size: float = FONT, tick_size: float = FONT) -> None:
        y = self.y + self.h + TICK + PAD + tick_size + PAD + size / 2
        self.canvas.text(self.x + self.w / 2, y, text, size, "middle")

    def title(self, text: str, size: float = FONT) -> None:
        self.canvas.text(self.x + self.w / 2, self.y - PAD - size / 2, text, size, "middle")

    def hbar(self, row: float, value: float, color: str, thickness: float = 0.8) -> None:
        """A bar from 0 to ``value`` on row ``row`` (thickness in rows)."""
        if not math.isfinite(value):
            return
        x0, x1 = self.px(0), self.px(value)
        ya, yb = self.py(row - thickness / 2), self.py(row + thickness / 2)
        self.canvas.rect(min(x0, x1), min(ya, yb), abs(x1 - x0), abs(yb - ya), color)

    def vbar(self, at: float, value: float, color: str, thickness: float = 0.8) -> None:
        if not math.isfinite(value):
            return
        y0, y1 = self.py(0), self.py(value)
        xa, xb = self.px(at - thickness / 2), self.px(at + thickness / 2)
        self.canvas.rect(min(xa, xb), min(y0, y1), abs(xb - xa), abs(y1 - y0), color)

    def vline(self, v: float, color: str, dash: str | None = "4 2", width: float = 1.0) -> None:
        x = self.px(v)
        self.canvas.line(x, self.y, x, self.y + self.h, color, width, dash)

    def hline(self, v: float, color: str, dash: str | None = "4 2", width: float = 1.0) -> None:
        y = self.py(v)
        self.canvas.line(self.x, y, self.x + self.w, y, color, width, dash)

    def plot(self, xs: Sequence[float], ys: Sequence[float], color: str, width: float = 1.2) -> None:
        """A line through the points; a non-finite value breaks it."""
        run: list[tuple[float, float]] = []
        for x, y in zip(xs, ys, strict=True):
            if self.xs.contains(x) and self.ys.contains(y):
                run.append((self.px(x), self.py(y)))
            else:
                self.canvas.polyline(run, color, width)
                run = []
        self.canvas.polyline(run, color, width)


@dataclass(frozen=True)
class Key:
    """A legend entry: ``kind`` is patch (a filled square), marker (a dot), hollow (a ring) or dash (a dashed line)."""

    label: str
    color: str
    kind: str = "patch"


_SWATCH = 16.0
_KEY_GAP = 5.0
_COL_GAP = 14.0


def _legend_columns(keys: Sequence[Key], max_width: float, size: float, max_cols: int) -> list[float]:
    """The column widths of the widest layout (at most ``max_cols`` columns) that fits ``max_width``."""
    widths = [_SWATCH + _KEY_GAP + text_width(k.label, size) for k in keys]
    for ncol in range(min(max_cols, len(keys)), 0, -1):
        cols = [max(widths[c::ncol]) for c in range(ncol)]
        if sum(cols) + _COL_GAP * (ncol - 1) <= max_width or ncol == 1:
            return cols
    return [max(widths, default=0.0)]


def legend_height(keys: Sequence[Key], max_width: float, size: float = FONT, max_cols: int = 8) -> float:
    ncol = len(_legend_columns(keys, max_width, size, max_cols))
    return math.ceil(len(keys) / ncol) * size * 1.6


def legend(
    canvas: Canvas,
    keys: Sequence[Key],
    x: float,
    y: float,
    max_width: float,
    size: float = FONT,
    max_cols: int = 8,
    center: bool = True,
) -> float:
    """Keys in rows from the top ``y``, across ``max_width`` from ``x`` (centered in it, or from its left); returns
    the height used."""
    cols = _legend_columns(keys, max_width, size, max_cols)
    total = sum(cols) + _COL_GAP * (len(cols) - 1)
    left = x + (max_width - total) / 2 if center else x
    line = size * 1.6
    for i, key in enumerate(keys):
        r, c = divmod(i, len(cols))
        kx = left + sum(cols[:c]) + _COL_GAP * c
        ky = y + r * line + line / 2
        if key.kind == "patch":
            canvas.rect(kx + 2, ky - size * 0.4, _SWATCH - 4, size * 0.8, key.color)
        elif key.kind == "dash":
            canvas.line(kx, ky, kx + _SWATCH, ky, key.color, 1.0, "4 2")
        else:
            canvas.circle(kx + _SWATCH / 2, ky, 3.0, key.color, hollow=key.kind == "hollow")
        canvas.text(kx + _SWATCH + _KEY_GAP, ky, key.label, size)
    return math.ceil(len(keys) / len(cols)) * line
