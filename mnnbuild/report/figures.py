"""The report's figures: matplotlib drawn to SVG text, inlined into the page (no files, no network).

Each function takes plain data and returns one ``<svg>`` element without a fixed size (its viewBox keeps
the aspect ratio; the page's CSS makes it as wide as the screen). The output is deterministic: no date in the
metadata and a fixed id salt per figure, so an unchanged report is byte-identical.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import matplotlib
from matplotlib.colors import to_hex
from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mnnbuild.report.data import CPU, OpCell, runs

CPU_COLOR = "#9e9e9e"
PASS_COLOR = "#2e7d32"
FAIL_COLOR = "#c62828"
DECODE_COLOR = "#1565c0"
PREFILL_COLOR = "#ef6c00"
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_ID_REF = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')
_ROOT_SIZE = re.compile(r'^(<svg\b[^>]*?)\s(?:width|height)="[^"]*"(?:\s(?:width|height)="[^"]*")?')


def plugin_colors(plugins: Sequence[str]) -> dict[str, str]:
    cmap = matplotlib.colormaps["tab10" if len(plugins) <= 10 else "tab20"]
    colors = {p: to_hex(cmap(i % cmap.N)) for i, p in enumerate(plugins)}
    return {CPU: CPU_COLOR, **colors}


def to_svg(fig: Figure, salt: str) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no fixed width/height)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = _METADATA.sub("", text, count=1)  # RDF boilerplate (license and type URLs): nothing a reader needs
    text = _ROOT_SIZE.sub(r"\1", text, count=1)
    # every figure numbers its elements from 1 (figure_1, axes_1 ...): prefix ids so that they stay unique in the
    # page and each url(#...) / href="#..." finds its own figure's element
    text = _ID_REF.sub(lambda m: f"{m.group(1)}{salt}-{m.group(2)}", text)
    return text.replace("<svg", f'<svg role="img" aria-label="{salt}" class="figure"', 1)


def _figure(width: float, height: float, left: float = 0.07, bottom: float = 0.6, top: float = 0.35) -> Figure:
    """A figure with fixed margins in inches (no tight layout: measuring every label is slow)."""
    fig = Figure(figsize=(width, height))
    fig.patch.set_alpha(0)
    fig.subplots_adjust(left=left, right=0.98, bottom=bottom / height, top=1 - top / height, wspace=0.25)
    return fig


def partition_strip(cells: Sequence[OpCell], plugins: Sequence[str]) -> str:
    """The model's ops in order as one strip, colored CPU vs each plugin."""
    colors = plugin_colors(plugins)
    legend_rows = (len(plugins) + 1 + 5) // 6
    fig = _figure(10, 1.3 + 0.25 * legend_rows, left=0.02, bottom=0.55 + 0.25 * legend_rows, top=0.1)
    ax = fig.add_subplot()
    for start, length, where in runs(list(cells)):
        ax.broken_barh([(start, length)], (0, 1), facecolors=colors.get(where, CPU_COLOR), edgecolor="white", lw=0.3)
    ax.set_xlim(0, max(len(cells), 1))
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel(f"{len(cells)} ops in source order")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=colors[k], label=k) for k in [CPU, *plugins]]
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.75), ncol=min(6, len(handles)), frameon=False
    )
    return to_svg(fig, "partition-strip")


def plugin_sizes(plugins: Sequence[str], weight_bytes: Sequence[int], binary_bytes: Sequence[int]) -> str:
    """Per plugin: its weights in the source model and its shipped context binary, in MiB."""
    fig = _figure(10, 1.5 + 0.35 * max(len(plugins), 1), left=0.16, top=0.6)
    ax = fig.add_subplot()
    y = range(len(plugins))
    ax.barh([i + 0.2 for i in y], [b / 2**20 for b in weight_bytes], height=0.4, label="weights (source model)")
    ax.barh([i - 0.2 for i in y], [b / 2**20 for b in binary_bytes], height=0.4, label="context binary (shipped)")
    ax.set_yticks(list(y), list(plugins))
    ax.invert_yaxis()
    ax.set_xlabel("MiB")
    # above the axes, never over a bar
    ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, borderaxespad=0.2)
    return to_svg(fig, "plugin-sizes")


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
    n = max(len(labels), 1)
    fig = _figure(10, 1.3 + 0.2 * n, left=0.3, bottom=0.75, top=0.55)
    ax_err, ax_cos = fig.subplots(1, 2, sharey=True)
    y = list(range(len(labels)))
    colors = [PREFILL_COLOR if p else DECODE_COLOR for p in prefill]
    for ax, values, limit, title, line in (
        (ax_err, rel_err, max_rel_err, "max abs error / reference max abs", f"tolerance {max_rel_err:.0%}"),
        (ax_cos, [None if c is None else 1 - c for c in cosine], 1 - min_cosine, "1 - cosine", f"cosine {min_cosine}"),
    ):
        positive = [v for v in values if v is not None and v > 0]
        floor = min([*positive, limit]) / 10 if (positive or limit > 0) else 1e-9
        shown = [(i, v) for i, v in enumerate(values) if v is not None and v > 0]
        zeros = [i for i, v in enumerate(values) if v is not None and v <= 0]
        missing = [i for i, v in enumerate(values) if v is None]
        ax.scatter([v for _, v in shown], [i for i, _ in shown], c=[colors[i] for i, _ in shown], s=16, zorder=3)
        if zeros:
            ax.scatter([floor] * len(zeros), zeros, facecolors="none", edgecolors=[colors[i] for i in zeros], s=16)
        for i in missing:
            ax.text(floor, i, " n/a", va="center", ha="left", fontsize="small", color=CPU_COLOR)
        if limit > 0:
            ax.axvline(limit, color=FAIL_COLOR, ls="--", lw=1, label=line)
        ax.set_xscale("log")
        ax.set_xlim(left=floor / 2)
        ax.set_title(title, fontsize="medium")
        ax.grid(axis="y", color="#eeeeee", lw=0.5)
    ax_err.set_yticks(y, list(labels), fontsize="small")
    ax_err.set_ylim(len(labels) - 0.5, -0.5)
    handles = [
        Patch(color=DECODE_COLOR, label="decode graph"),
        Patch(color=PREFILL_COLOR, label="prefill graph"),
        Line2D([], [], marker="o", ls="none", mfc="none", mec=CPU_COLOR, label="0 (exact)"),
        *ax_err.get_legend_handles_labels()[0],
        *ax_cos.get_legend_handles_labels()[0],
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize="small")
    return to_svg(fig, "graph-errors")


def position_errors(seq_len: int, rel_err: Sequence[float], cosine: Sequence[float | None], max_rel_err: float) -> str:
    """(b) the whole model's logits error per position of the prefill chunk."""
    fig = _figure(10, 3)
    ax_err, ax_cos = fig.subplots(1, 2)
    pos = range(len(rel_err))
    ax_err.plot(pos, rel_err, color=PREFILL_COLOR, lw=1.2)
    ax_err.axhline(max_rel_err, color=FAIL_COLOR, ls="--", lw=1, label=f"tolerance {max_rel_err:.0%}")
    ax_err.set_title(f"logits: max abs error / row max abs (seq {seq_len})")
    ax_err.set_ylim(bottom=0)
    ax_err.legend(frameon=False, fontsize="small")
    ax_cos.plot(pos, [1 - c if c is not None else 0.0 for c in cosine], color=DECODE_COLOR, lw=1.2)
    ax_cos.set_title("logits: 1 - cosine per position")
    ax_cos.set_ylim(bottom=0)
    for ax in (ax_err, ax_cos):
        ax.set_xlabel("position in the chunk")
    return to_svg(fig, "position-errors")


def generation_steps(rel_err: Sequence[float | None], agree: Sequence[bool], max_rel_err: float) -> str:
    """(c) each greedy step's logits error, bars colored by whether the tokens agree."""
    fig = _figure(10, 2.6)
    ax = fig.add_subplot()
    steps = range(len(rel_err))
    ax.bar(steps, [v or 0.0 for v in rel_err], color=[PASS_COLOR if a else FAIL_COLOR for a in agree])
    ax.axhline(max_rel_err, color=FAIL_COLOR, ls="--", lw=1, label=f"tolerance {max_rel_err:.0%}")
    ax.set_xlabel("new token")
    ax.set_title("logits max abs error / reference max abs per greedy step (red: tokens differ)")
    ax.legend(frameon=False, fontsize="small")
    return to_svg(fig, "generation-steps")


def stage_costs(labels: Sequence[str], seconds: Sequence[float], peak_mib: Sequence[float]) -> str:
    """Wall time and peak RSS of each stage run."""
    fig = _figure(10, 1.1 + 0.3 * max(len(labels), 1), left=0.16)
    ax_t, ax_m = fig.subplots(1, 2, sharey=True)
    y = range(len(labels))
    ax_t.barh(list(y), list(seconds), color=DECODE_COLOR)
    ax_t.set_yticks(list(y), list(labels))
    ax_t.invert_yaxis()
    ax_t.set_xlabel("wall time (s)")
    ax_m.barh(list(y), list(peak_mib), color=PREFILL_COLOR)
    ax_m.set_xlabel("peak RSS (MiB)")
    ax_t.set_title("wall time per stage", fontsize="medium")
    ax_m.set_title("peak RSS per stage", fontsize="medium")
    return to_svg(fig, "stage-costs")


def file_sizes(paths: Sequence[str], sizes: Sequence[int]) -> str:
    """The bundle's largest files, in MiB."""
    fig = _figure(10, 1.1 + 0.3 * max(len(paths), 1), left=0.4)
    ax = fig.add_subplot()
    y = range(len(paths))
    ax.barh(list(y), [s / 2**20 for s in sizes], color=DECODE_COLOR)
    ax.set_yticks(list(y), list(paths), fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("MiB")
    ax.set_title(f"the bundle's {len(paths)} largest files", fontsize="medium")
    return to_svg(fig, "bundle-files")
