"""The page: ReportData -> one self-contained HTML document (Jinja2 template, inline CSS and SVG figures)."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from mnnbuild.base.sizes import human_bytes
from mnnbuild.report import figures
from mnnbuild.report.data import CPU, ReportData
from mnnbuild.report.template import TEMPLATE
from mnnbuild.verify.verdict import parting_note, timing_groups

LARGEST_FILES = 15
"""Bundle files drawn in the size figure (the table lists them all)."""
GRAPH_OUTPUTS_DRAWN = 40
"""Graph outputs drawn by name in figure (a); with more, the worst ones (the page says how many of all)."""


def output_label(name: str) -> str:
    """A graph output's tensor name, shortened for an axis: ``/blocks.0/self_attn/Add_output_0`` ->
    ``blocks.0/self_attn/Add``."""
    return name.strip("/").removesuffix("_output_0") or name


def size(n: float | None) -> str:
    return "n/a" if n is None else human_bytes(n)


def fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("mnnbuild.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = size
    env.filters["fmt"] = fmt
    return env


def _figures(data: ReportData) -> dict[str, str | None]:
    v, part = data.verify, data.partition
    out: dict[str, str | None] = {}
    out["strip"] = figures.partition_strip(data.ops, data.plugins) if data.ops else None
    out["plugin_sizes"] = (
        figures.plugin_sizes(
            data.plugins,
            [p.weight_bytes for p in part.plugins],
            [data.plugin_binaries.get(p.name, 0) for p in part.plugins],
        )
        if part.plugins
        else None
    )
    outputs = [(g, t) for g in v.graphs for t in g.outputs]
    if len(outputs) > GRAPH_OUTPUTS_DRAWN:  # the worst ones (by how far past the tolerance), in plugin order
        worst = sorted(range(len(outputs)), key=lambda i: -outputs[i][1].severity(v.graph_tolerance))
        outputs = [outputs[i] for i in sorted(worst[:GRAPH_OUTPUTS_DRAWN])]
    out["graph_errors"] = (
        figures.graph_errors(
            [f"{g.graph} {output_label(t.name)}" for g, t in outputs],
            ["_" in g.graph for g, _ in outputs],  # graphllm<s>_<k> with s > 0: a prefill shape
            [t.rel_err for _, t in outputs],
            [t.cosine for _, t in outputs],
            v.graph_tolerance.max_rel_err,
            v.graph_tolerance.min_cosine,
        )
        if outputs
        else None
    )
    prefill = [s for s in v.whole_model if s.seq_len > 1 and s.logits_rows is not None and s.logits_index is None]
    if prefill:
        longest = max(prefill, key=lambda s: s.seq_len)  # the full chunk, with several prefill lengths
        rows = longest.logits_rows
        assert rows is not None
        out["position_errors"] = figures.position_errors(
            longest.seq_len,
            [e / m if m > 0 else 0.0 for e, m in zip(rows.max_abs_err, rows.ref_max_abs, strict=True)],
            rows.cosine,
            v.model_tolerance.max_rel_err,
        )
    else:
        out["position_errors"] = None
    gen = v.generation
    out["generation"] = (
        figures.generation_steps(
            [s.logits.rel_err for s in gen.steps],
            [s.cpu_token == s.hybrid_pick for s in gen.steps],
            v.model_tolerance.max_rel_err,
        )
        if gen is not None and gen.steps
        else None
    )
    ran = [c for c in data.costs if c.seconds is not None]
    out["costs"] = (
        figures.stage_costs(
            [c.label for c in ran], [c.seconds or 0.0 for c in ran], [(c.peak_rss or 0) / 2**20 for c in ran]
        )
        if ran
        else None
    )
    largest = sorted(data.bundle_files, key=lambda r: -r.size)[:LARGEST_FILES]
    out["bundle_files"] = figures.file_sizes([r.path for r in largest], [r.size for r in largest]) if largest else None
    return out


def render_html(data: ReportData) -> str:
    """The report page for ``data``; deterministic (the same data gives the same bytes)."""
    context: dict[str, Any] = {
        "d": data,
        "v": data.verify,
        "p": data.partition,
        "checks": data.check_verdicts(),
        "figures": _figures(data),
        "colors": figures.plugin_colors(data.plugins),
        "cpu": CPU,
        "bundle_bytes": sum(r.size for r in data.bundle_files),
        "timings": timing_groups(data.verify.timings),
        "parting_note": parting_note,
        "graph_outputs": sum(len(g.outputs) for g in data.verify.graphs),
        "graph_outputs_drawn": min(GRAPH_OUTPUTS_DRAWN, sum(len(g.outputs) for g in data.verify.graphs)),
    }
    return _environment().get_template(TEMPLATE).render(context)
