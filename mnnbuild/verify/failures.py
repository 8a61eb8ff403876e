"""Judging a verify report: one line per failure, ordered by kind and severity, and the report's verdict.

Kinds, in the order they are listed: integrity, bundle and plugin structure, per graph, whole model, generation,
speculation.
The error message names the worst failure of each kind, so a hash mismatch alone never hides what the
numbers say.
"""

from __future__ import annotations

from dataclasses import dataclass

from mnnbuild.base.compare import NON_FINITE_REFERENCE, Tolerance
from mnnbuild.verify.verdict import (
    GenerationCheck,
    GraphCheck,
    PluginCheck,
    ShapeCheck,
    SpeculationCheck,
    VerifyReport,
    shape_label,
)

INTEGRITY, STRUCTURE, GRAPHS, WHOLE_MODEL, GENERATION, SPECULATION = range(6)


@dataclass(frozen=True)
class Failure:
    kind: int
    severity: float
    """Larger is worse; orders the failures within a kind."""
    line: str


def structure(line: str, severity: float = 0.0) -> Failure:
    return Failure(STRUCTURE, severity, line)


def graph_failures(graphs: list[GraphCheck], tol: Tolerance) -> list[Failure]:
    failures = []
    for g in graphs:
        if g.problem:
            failures.append(Failure(GRAPHS, float("inf"), f"graph {g.graph} ({g.binary}): {g.problem}"))
        for t in g.outputs:
            if not t.passed:
                line = f"graph {g.graph} ({g.binary}) output {t.describe(tol)}"
                failures.append(Failure(GRAPHS, t.severity(tol), line))
    return failures


def plugin_failures(plugins: list[PluginCheck]) -> list[Failure]:
    failures = []
    for p in plugins:
        if p.context_sha256 and p.bundle_sha256 and p.context_sha256 != p.bundle_sha256:
            failures.append(
                structure(f"plugin {p.path}: the bundle manifest's sha256 differs from the context stage's")
            )
        if p.problem:
            failures.append(structure(p.problem))
    return failures


def whole_model_failures(shapes: list[ShapeCheck], tol: Tolerance) -> list[Failure]:
    failures = []
    for s in shapes:
        where = f"whole model seq {shape_label(s)}" if s.image_size is None else f"visual encoder image {s.image_size}"
        if s.problem:
            failures.append(Failure(WHOLE_MODEL, float("inf"), f"{where}: {s.problem}"))
        for t in s.outputs:
            if not t.passed:
                failures.append(Failure(WHOLE_MODEL, t.severity(tol), f"{where}: {t.describe(tol)}"))
        if s.top1 is not None and not s.top1.passed:
            bad = [d for d in s.top1.disagreements if not d.tolerated]
            line = (
                f"{where}: top-1 differs on {len(bad)} rows beyond near-ties (first: row {bad[0].row}, reference "
                f"{bad[0].ref_token} leads hybrid's {bad[0].got_token} by {bad[0].ref_lead:.4g})"
            )
            failures.append(Failure(WHOLE_MODEL, 0.0, line))
    return failures


def generation_failures(gen: GenerationCheck | None, tol: Tolerance) -> list[Failure]:
    if gen is None or gen.passed:
        return []
    if gen.problem:
        return [Failure(GENERATION, 0.0, f"generation: {gen.problem}")]
    failures = []
    bad_steps = [s for s in gen.steps if not s.logits.passed]
    no_ref = [s for s in bad_steps if (s.logits.problem or "").startswith(NON_FINITE_REFERENCE)]
    if no_ref:  # the CPU's own arithmetic failed (a norm with epsilon 0 ...): say so, not a bundle mismatch
        line = (
            f"generation: the CPU reference's logits are not finite at {len(no_ref)} of {len(gen.steps)} steps, "
            f"so they cannot be compared; step {no_ref[0].step}: {no_ref[0].logits.problem}"
        )
        failures.append(Failure(GENERATION, 0.0, line))
        bad_steps = [s for s in bad_steps if s not in no_ref]
    if bad_steps:
        worst = max(bad_steps, key=lambda s: s.logits.severity(tol))
        line = (
            f"generation: the logits of {len(bad_steps)} of {len(gen.steps)} steps out of tolerance; worst: step "
            f"{worst.step} {worst.logits.describe(tol)}"
        )
        failures.append(Failure(GENERATION, 0.0, line))
    flips = [s for s in gen.bad_flips if s not in no_ref]  # a NaN row's pick is no pick
    if flips:
        s, more = flips[0], f" (and {len(flips) - 1} more steps)" if len(flips) > 1 else ""
        line = (
            f"generation: at new token {s.step} the bundle picks {s.hybrid_pick} where the CPU picks {s.cpu_token}, "
            f"which it prefers by {s.cpu_lead or 0.0:.4g} (top-2 margin {s.cpu_margin:.4g}, NOT a near-tie){more}; "
            f"cpu {gen.cpu_tokens}, hybrid {gen.hybrid_tokens}"
        )
        failures.append(Failure(GENERATION, 0.0, line))
    return failures


def speculation_failures(spec: SpeculationCheck | None, tol: Tolerance) -> list[Failure]:
    """A speculating bundle's checks: the tree-shaped sample, then the speculative tokens (naming the step)."""
    if spec is None or spec.passed:
        return []
    if spec.problem:
        return [Failure(SPECULATION, float("inf"), f"speculation: {spec.problem}")]
    failures = []
    if spec.tree_check is not None and not spec.tree_check.passed:
        where = f"speculation: tree-shaped sample ({spec.verify_length} rows)"
        failures += [
            Failure(SPECULATION, f.severity, f.line.replace(f"whole model seq {spec.verify_length}", where))
            for f in whole_model_failures([spec.tree_check], tol)
        ]
    bad = [s for s in spec.steps if not s.logits.passed]
    if bad:
        worst = max(bad, key=lambda s: s.logits.severity(tol))
        failures.append(
            Failure(
                SPECULATION,
                worst.logits.severity(tol),
                f"speculation: the logits of {len(bad)} of "
                f"{len(spec.steps)} steps out of tolerance; worst: step {worst.step} "
                f"{worst.logits.describe(tol)}",
            )
        )
    flipped = spec.first_difference is not None and not (spec.steps and spec.steps[-1].tolerated_flip)
    if flipped:
        failures.append(
            Failure(
                SPECULATION,
                0.0,
                f"speculation: {spec.difference_note}; cpu {spec.cpu_tokens}, speculative {spec.bundle_tokens}",
            )
        )
    return failures


def executed_note(plugins: list[PluginCheck]) -> str:
    """What ran in the simulator, in one sentence for the report."""
    executed = {p.path: p.executed or "not run" for p in plugins}
    if sorted(set(executed.values())) == ["override"]:
        return (
            "executed in the simulator: unshared twins built from the same graphs and weights (this x86 QNN library "
            "cannot load the shipped weight-shared binaries); the shipped binaries were checked by sha256 and "
            "binary info"
        )
    if executed:
        return f"executed in the simulator per plugin: {executed}"
    return "nothing was executed in the simulator (see the failures)"


def conclude(report: VerifyReport, failures: list[Failure]) -> None:
    """Set the report's failures (by kind, worst first), headline (the worst of each kind) and verdict."""
    ordered = sorted(failures, key=lambda f: (f.kind, -f.severity))
    report.failures = [f.line for f in ordered]
    headline: dict[int, str] = {}
    for f in ordered:
        headline.setdefault(f.kind, f.line)
    report.headline = list(headline.values())
    report.passed = not failures
