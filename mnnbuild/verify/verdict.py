"""The verify verdict: the report's pydantic models (``verify.json``) and its human-readable table (``verify.txt``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mnnbuild.base.compare import TensorCheck, Tolerance
from mnnbuild.verify.compare import RowErrors


class IntegrityCheck(BaseModel):
    """Every bundle file against the bundle manifest (path, size, sha256)."""

    files: int
    hashed: int = 0
    """Files hashed; the others had the stamp they had when the bundle stage (or a checked restore) hashed them."""
    hash_seconds: float = 0.0
    """Time spent hashing them."""
    problems: list[str] = Field(default_factory=list)
    passed: bool


class PluginCheck(BaseModel):
    """One plugin's shipped binary: hashes along the chain, structure (binary info), what was executed."""

    plugin: str
    path: str
    graphs: list[str]
    bundle_sha256: str | None = None
    """The shipped file's hash as the bundle manifest records it."""
    context_sha256: str | None = None
    """The hash the context stage recorded; the twin was built from the same graphs and weights."""
    shipped_sha256: str | None = None
    """The file's hash now."""
    shipped_weight_shared: bool | None = None
    target: dict[str, Any] | None = None
    twin_sha256: str | None = None
    executed: str | None = None
    """``override`` (the unshared twin ran) or ``shipped``."""
    executed_source: str | None = None
    load_seconds: float | None = None
    """Creating its context, over every load."""
    loads: int | None = None
    """How often its context was loaded (verify keeps a bounded number loaded at once)."""
    simulator_seconds: dict[str, float] = Field(default_factory=dict)
    passed: bool
    problem: str | None = None


class GraphCheck(BaseModel):
    """(a) One graph of one plugin in the simulator (unshared twin) vs its source ops on the CPU, on the same
    inputs: those the whole-model pass fed it (``fed="bundle_pass"``), or for a graph no pass ran, the partition's
    reference inputs, against its reference outputs (``fed="reference"``)."""

    graph: str
    binary: str
    fed: Literal["bundle_pass", "reference"] = "reference"
    simulator_seconds: float | None = None
    outputs: list[TensorCheck] = Field(default_factory=list)
    passed: bool
    problem: str | None = None


class Top1Disagreement(BaseModel):
    row: int
    ref_token: int
    got_token: int
    ref_lead: float
    """Reference logit of its top-1 minus that of the token the hybrid picked."""
    tolerated: bool


class Top1Check(BaseModel):
    rows: int
    agree: int
    disagreements: list[Top1Disagreement] = Field(default_factory=list)
    min_ref_margin: float
    """Smallest top-1 minus top-2 gap of the reference rows (how close to a tie the sample gets)."""
    passed: bool


class ShapeCheck(BaseModel):
    """(b) The whole model on one io sample: hybrid (bundle) vs the original model in MNN on the CPU."""

    seq_len: int
    """Tokens; for a VL encoder's sample, its patches."""
    image_size: str | None = None
    """A VL encoder's sample: the image size (``seq_len`` patches)."""
    logits_index: int | None = None
    """A whole-block sample's ``logits_index`` (-1: a prefill block the prompt fills whole, the last row's logits
    only, as MNN's engine feeds it; no graph is compiled for it); None for a graph's own sample."""
    outputs: list[TensorCheck] = Field(default_factory=list)
    top1: Top1Check | None = None
    logits_rows: RowErrors | None = None
    """The logits' error per position (row) of the sample."""
    seconds: float | None = None
    mnn_seconds: float | None = None
    qnn_seconds: float | None = None
    passed: bool
    problem: str | None = None


def shape_label(s: ShapeCheck) -> str:
    """``128``, ``128 (whole block, logits_index -1)`` or ``64 (image 224x224)``."""
    if s.image_size is not None:
        return f"{s.seq_len} (image {s.image_size})"
    if s.logits_index is not None:
        return f"{s.seq_len} (whole block, logits_index {s.logits_index})"
    return str(s.seq_len)


class GenerationStep(BaseModel):
    """One step, on the prefix ``prompt + cpu_tokens[:step]`` for both."""

    step: int
    cpu_token: int
    """The CPU's pick: the argmax of the original model's recompute forward for this prefix (usually
    ``cpu_tokens[step]``; where not, MNN's engine parts from it: ``GenerationCheck.engine_partings``)."""
    hybrid_pick: int
    """The hybrid's argmax for the same prefix."""
    cpu_margin: float
    logits: TensorCheck
    tolerated_flip: bool = False
    cpu_lead: float | None = None
    """A flip (``hybrid_pick`` is not ``cpu_token``): how far the CPU's row prefers its pick to the hybrid's."""


class EngineParting(BaseModel):
    """A step where MNN's KV-cache engine's token is not the argmax of MNN's recompute forward on the same prefix:
    two CPU arithmetics of the same model take a close call differently. The bundle is judged against the forward,
    on the engine's tokens, so this is recorded, never a failure (docs/verify.md)."""

    step: int
    engine_token: int
    """``cpu_tokens[step]``: the token the sequence goes on with."""
    recompute_token: int
    """The recompute forward's argmax (the step's ``cpu_token``, the pick the hybrid is judged against)."""
    lead: float
    """How far the recompute row prefers its token to the engine's."""
    near_tie: bool
    """``lead`` within the near-tie margin."""
    engine_rel_err: float | None = None
    """The engine's own logits row for this step vs the recompute row: max abs error over the row's max |logit|
    (None: not known)."""
    engine_cosine: float | None = None


class GenerationCheck(BaseModel):
    """(c) Greedy generation: hybrid (bundle) vs MNN CPU on the original model, same prompt, step by step on one
    sequence: MNN's own greedy tokens (``cpu_tokens``)."""

    prompt: str
    prompt_ids: list[int] = Field(default_factory=list)
    max_new_tokens: int
    cpu_tokens: list[int] = Field(default_factory=list)
    """The sequence every step runs on, for the CPU and the bundle alike: MNN's greedy tokens from its KV-cache engine
    (``sequence``)."""
    sequence: Literal["engine", "recompute"] = "engine"
    """Where ``cpu_tokens`` come from: MNN's KV-cache engine, or (when the engine cannot run the model) the original
    model's recompute loop."""
    engine_partings: list[EngineParting] = Field(default_factory=list)
    """Steps where the engine's token is not the recompute forward's pick (the CPU's two arithmetics part)."""
    hybrid_tokens: list[int] = Field(default_factory=list)
    """The bundle's greedy tokens: ``cpu_tokens`` up to and including its first own pick, or on to the end when the
    bundle's loop was followed past it (``followed``)."""
    followed: bool = False
    """The bundle's loop ran on past a divergence (``VerifyParams.follow_divergence``)."""
    first_divergence: int | None = None
    """Index into the generated tokens of the first difference of ``hybrid_tokens`` from ``cpu_tokens`` (None:
    identical)."""
    divergence_note: str | None = None
    steps: list[GenerationStep] = Field(default_factory=list)
    cpu_text: str | None = None
    hybrid_text: str | None = None
    cpu_seconds: float | None = None
    hybrid_seconds: float | None = None
    hybrid_forwards: int = 0
    shared_lengths: list[int] = Field(default_factory=list)
    """Prefill lengths whose forward was the whole-model check's run of the io sample (one simulator pass for two
    checks)."""
    passed: bool
    problem: str | None = None

    @property
    def bad_flips(self) -> list[GenerationStep]:
        """The steps whose hybrid pick is not the CPU's, beyond a near-tie."""
        return [s for s in self.steps if s.hybrid_pick != s.cpu_token and not s.tolerated_flip]


class TreeSample(BaseModel):
    """The engine's verifying forward for a real draft tree (a speculating bundle's (b) sample)."""

    tokens: list[int]
    """The sampled token, then the tree's best nodes (target ids)."""
    positions: list[int]
    """``position_ids``: the prompt's length plus each row's depth (the sampled token's 0)."""
    sees: list[list[int]]
    """The tree mask: 1 where a row attends to a column."""
    topk: int
    """Candidates per node the draft grew it with."""
    chain: bool
    """The nodes form a chain (the mask is causal): a draft too sure of itself for any branch."""
    forked: bool = False
    """The draft's best nodes formed a chain; its deepest gave way to the best node that branches, so the sample's
    mask is a tree's."""


class SpeculationRound(BaseModel):
    """One target round of the speculative loop."""

    draft: list[int]
    accepted: int
    """Draft tokens the target confirmed."""
    tokens: int
    """Tokens the round added."""
    forwards: int
    """Target forwards it ran."""
    cut: bool = False
    """Its draft was cut to the tokens left (the last round; not in the mean)."""


class SpeculationCheck(BaseModel):
    """A speculating bundle (``speculative_type`` in its config): (b) the engine's verifying forward on a draft tree,
    and (c) the bundle's speculative greedy tokens against the CPU's plain greedy ones
    (`mnnbuild.verify.speculation`)."""

    kind: str
    draft_length: int = 0
    """``draft_predict_length``: draft tokens per target forward."""
    topk: int = 1
    depth: int = 3
    verify_length: int = 0
    """Rows of the engine's verifying forward (``draft_length`` + 1)."""
    settings: dict[str, str | int | bool] = Field(default_factory=dict)
    """lookahead: its settings as the bundle's config gives them (``draft_match_strictness``, ...)."""
    tree: TreeSample | None = None
    tree_check: ShapeCheck | None = None
    prompt_ids: list[int] = Field(default_factory=list)
    cpu_tokens: list[int] = Field(default_factory=list)
    """The original model's plain greedy tokens on the CPU (the recompute loop's)."""
    bundle_tokens: list[int] = Field(default_factory=list)
    """The bundle's speculative greedy tokens (its draft on the CPU, its forwards in the simulator)."""
    rounds: list[SpeculationRound] = Field(default_factory=list)
    forwards: int = 0
    """Target forwards of the bundle's loop."""
    replayed_forwards: int = 0
    """Of them, those whose rows came from the generation check's bundle pass (the same rows: causal mask)."""
    simulator_forwards: int = 0
    """Of them, those the loop ran in the simulator itself."""
    mean_accepted: float | None = None
    """Tokens per target forward over the rounds that drafted (the prompt's forward excluded, as MNN's engine
    counts its decode; a last round cut to the tokens left too, unless it is the only one)."""
    npu_weight_bytes_per_forward: int | None = None
    """NPU weight bytes one forward reads (every plugin weight once, as stored)."""
    npu_weight_bytes_per_token: float | None = None
    """``npu_weight_bytes_per_forward`` / ``mean_accepted``: a size, not a speed."""
    first_difference: int | None = None
    """The first new token where the bundle's speculative tokens are not the CPU's plain ones (None: identical)."""
    difference_note: str | None = None
    steps: list[GenerationStep] = Field(default_factory=list)
    """Per step up to ``first_difference``: the bundle loop's row vs the CPU's, on the same prefix."""
    seconds: float | None = None
    note: str | None = None
    passed: bool
    problem: str | None = None


class VerifyReport(BaseModel):
    model: str
    target: str
    soc: str
    bundle: str
    """The bundle's model dir, relative to the verify dir (``../bundle/model/<name>``)."""
    passed: bool
    failures: list[str] = Field(default_factory=list)
    """One line per failed check, the worst first."""
    headline: list[str] = Field(default_factory=list)
    """The worst failure of each kind (integrity, structure, graphs, whole model, generation): the error message."""
    graph_tolerance: Tolerance
    model_tolerance: Tolerance
    executed_note: str
    integrity: IntegrityCheck | None = None
    plugins: list[PluginCheck] = Field(default_factory=list)
    graphs: list[GraphCheck] = Field(default_factory=list)
    whole_model: list[ShapeCheck] = Field(default_factory=list)
    generation: GenerationCheck | None = None
    speculation: SpeculationCheck | None = None
    """Only for a bundle whose config asks for speculation."""
    qnn: dict[str, str] = Field(default_factory=dict)
    binaries_hashed: int = 0
    """Reads of context binaries (shipped, twins; at each check and load) that hashed them; the others took a hash
    known with the file's unchanged stamp (integrity's, the twin stage's, an earlier read's)."""
    binaries_trusted: int = 0
    timings: dict[str, float] = Field(default_factory=dict)
    """Where each second went (:data:`TIMING_LABELS`)."""


TIME_PHASES = {
    "integrity": "integrity",
    "qnn_library": "QNN library",
    "open": "opening the bundle",
    "twins": "reading the twins",
    "plugin_checks": "plugin checks",
    "samples": "reading the io samples",
    "bundle_pass": "simulator pass",
    "graphs": "per-graph checks",
    "reference_wait": "waiting for the CPU reference",
    "comparison": "comparison",
    "generation": "generation",
    "speculation": "speculation",
    "other": "other",
}
"""``timings`` keys of verify's own steps, one after the other: with ``other`` they add up to ``total``."""
TIME_PARTS = {
    "loads": ("context loads", "bundle_pass"),
    "simulator": ("graphs in the simulator", "bundle_pass"),
    "cpu_segments": ("CPU segments", "bundle_pass"),
    "whole_blocks": ("whole-block samples", "bundle_pass"),
    "hashing": ("hashing", None),
    "cpu_reference_start": ("process start", "cpu_reference"),
    "cpu_reference_draft": ("KV-cache draft", "cpu_reference"),
    "cpu_reference_confirm": ("recompute forwards on the draft", "cpu_reference"),
    "cpu_reference_shared": ("shared samples' forwards", "cpu_reference"),
}
"""``timings`` keys of what a step (or, for ``hashing``, all of them) spent on one thing: counted in it already."""
TIME_TOTALS = {
    "cpu_reference": "CPU reference",
    "overlap": "ran beside",
    "total": "total",
}
"""``cpu_reference``: the generation reference's own time, here or in its child process beside the other steps;
``overlap``: how much of it ran beside them (``total`` + ``overlap`` is the work done); ``total``: verify's wall
time."""
TIMING_LABELS = {**TIME_PHASES, **{k: words for k, (words, _) in TIME_PARTS.items()}, **TIME_TOTALS}
"""Every ``timings`` key in words, in order."""


def finish_timings(timings: dict[str, float]) -> dict[str, float]:
    """``timings`` with ``other`` (the part of ``total`` no step counted) and ``overlap``, rounded, in the order of
    :data:`TIMING_LABELS`."""
    found = dict(timings)
    found["other"] = max(0.0, found.get("total", 0.0) - sum(found.get(k, 0.0) for k in TIME_PHASES if k != "other"))
    if "cpu_reference" in found:
        found["overlap"] = max(0.0, found["cpu_reference"] - found.get("reference_wait", 0.0))
    order = {k: i for i, k in enumerate(TIMING_LABELS)}
    return {k: round(v, 3) for k, v in sorted(found.items(), key=lambda kv: order.get(kv[0], len(order)))}


def timing_groups(timings: dict[str, float]) -> dict[str, list[tuple[str, float]]]:
    """``timings`` in words, in three groups: ``steps`` (verify's own, one after the other, and ``total``),
    ``parts`` (what steps spent on one thing) and ``reference`` (the CPU reference's own time, its parts and how much
    ran beside the steps)."""
    groups: dict[str, list[tuple[str, float]]] = {"steps": [], "parts": [], "reference": []}
    for key, value in timings.items():
        words = TIMING_LABELS.get(key, key.replace("_", " "))
        if key in TIME_PHASES or key == "total":
            groups["steps"].append((words, value))
        elif key in TIME_PARTS and TIME_PARTS[key][1] != "cpu_reference":
            groups["parts"].append((words, value))
        else:
            groups["reference"].append((words, value))
    return groups


def timing_lines(timings: dict[str, float]) -> list[str]:
    """verify.txt's account of where each second went: the steps, what each spent on what, and what ran beside."""
    if not timings:
        return []
    total = timings.get("total", 0.0)
    lines = ["", f"time: {total:.2f} s wall"]
    for key, words in TIME_PHASES.items():
        if key not in timings:
            continue
        parts = [f"{w} {timings[k]:.2f}" for k, (w, of) in TIME_PARTS.items() if of == key and k in timings]
        lines.append(f"  {words:<30} {timings[key]:8.2f} s" + (f"  (of which {', '.join(parts)})" if parts else ""))
    if "hashing" in timings:
        lines.append(f"  {'hashing, in the steps above':<30} {timings['hashing']:8.2f} s")
    if "cpu_reference" in timings:
        parts = [f"{w} {timings[k]:.2f}" for k, (w, of) in TIME_PARTS.items() if of == "cpu_reference" and k in timings]
        overlap = timings.get("overlap", 0.0)
        lines.append(
            f"  {'CPU reference':<30} {timings['cpu_reference']:8.2f} s  ({', '.join(parts)}); "
            f"{overlap:.2f} s of it beside the steps above: {total + overlap:.2f} s of work in {total:.2f} s"
        )
    return lines


def parting_note(p: EngineParting) -> str:
    """One engine parting in words (verify.txt and the page report)."""
    tie = "a near-tie" if p.near_tie else "beyond a near-tie"
    engine = ""
    if p.engine_rel_err is not None:
        cosine = _f(p.engine_cosine, ".6f")
        engine = f"; the engine's own logits are {p.engine_rel_err:.2%} off the forward's here (cosine {cosine})"
    return (
        f"MNN's KV-cache engine and its recompute forward part at new token {p.step}: engine {p.engine_token}, "
        f"forward {p.recompute_token}, which it prefers by {p.lead:.4g} ({tie}){engine}; not the bundle's concern"
    )


def _ok(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def _tensor_rows(prefix: list[str], checks: list[TensorCheck]) -> list[list[str]]:
    return [
        [
            *prefix,
            t.qnn_name or t.name,
            "x".join(map(str, t.shape)),
            _f(t.max_abs_err, ".3g"),
            _f(t.rel_err, ".3%"),
            _f(t.cosine, ".6f"),
            _ok(t.passed) + (f" ({t.problem})" if t.problem else ""),
        ]
        for t in checks
    ]


def format_report(r: VerifyReport) -> str:
    """verify.txt: verdict and failures first, then one table per check."""
    lines = [
        f"verify {r.model} for {r.soc} ({r.target}): {'PASSED' if r.passed else 'FAILED'}",
        f"bundle {r.bundle} (relative to this file's directory)",
        f"tolerance per graph: cosine >= {r.graph_tolerance.min_cosine}, max abs err <= "
        f"{r.graph_tolerance.max_rel_err:.1%} of ref max abs; whole model: cosine >= {r.model_tolerance.min_cosine}, "
        f"<= {r.model_tolerance.max_rel_err:.1%}; top-1 flips tolerated only on near-ties (lead <= "
        f"{r.model_tolerance.tie_margin:.1%} of the row's max |logit|)",
        r.executed_note,
    ]
    if r.failures:
        lines += ["", "failures (worst first):", *(f"  - {f}" for f in r.failures)]
    if r.integrity is not None:
        hashed = f"{r.integrity.hashed} hashed, the others unchanged since hashed"
        lines += [
            "",
            f"bundle integrity: {r.integrity.files} files vs bundle manifest ({hashed}): {_ok(r.integrity.passed)}",
        ]
        lines += [f"  - {p}" for p in r.integrity.problems]
    if r.plugins:
        lines += ["", "plugins (shipped binary checked by sha256 and binary info; which binary ran):"]
        rows = [
            [
                p.path,
                ",".join(p.graphs),
                (p.shipped_sha256 or "?")[:12],
                "yes" if p.context_sha256 and p.context_sha256 == p.shipped_sha256 else "NO",
                {True: "yes", False: "no", None: "?"}[p.shipped_weight_shared],
                str((p.target or {}).get("soc_type")),
                (f"{p.executed}: {p.executed_source}" if p.executed else "-"),
                _ok(p.passed) + (f" ({p.problem})" if p.problem else ""),
            ]
            for p in r.plugins
        ]
        lines += _table(["plugin", "graphs", "sha256", "=context", "shared", "soc", "executed", "result"], rows)
        lines.append(
            f"  binaries read {r.binaries_hashed + r.binaries_trusted} times: hashed {r.binaries_hashed}, the others "
            "unchanged (same size, mtime, ctime, inode) since their hash was known"
        )
    if r.graphs:
        lines += [
            "",
            "(a) per graph: simulator (unshared twin) vs its ops in MNN on the same inputs (fed: by the whole-model "
            "pass, or the partition's reference)",
        ]
        rows = []
        for g in r.graphs:
            prefix = [g.graph, g.fed, _f(g.simulator_seconds, ".4f")]
            if g.outputs:
                rows += _tensor_rows(prefix, g.outputs)
            else:
                rows.append([*prefix, "-", "-", "-", "-", "-", f"FAIL ({g.problem})"])
        lines += _table(["graph", "fed", "sim s", "output", "shape", "max abs", "rel", "cosine", "result"], rows)
    if r.whole_model:
        lines += [
            "",
            "(b) whole model: hybrid (bundle, CPU in MNN + plugins in the simulator) vs original model on CPU",
        ]
        rows = []
        for s in r.whole_model:
            prefix = [shape_label(s)]
            if s.outputs:
                rows += _tensor_rows(prefix, s.outputs)
            else:
                rows.append([*prefix, "-", "-", "-", "-", "-", f"FAIL ({s.problem})"])
        lines += _table(["seq", "output", "shape", "max abs", "rel", "cosine", "result"], rows)
        for s in r.whole_model:
            if s.top1 is not None:
                t = s.top1
                lines.append(
                    f"  seq {shape_label(s)}: top-1 agreement {t.agree}/{t.rows} (min reference top-2 margin "
                    f"{t.min_ref_margin:.3g}) {_ok(t.passed)}; {_f(s.seconds, '.3f')} s "
                    f"(MNN {_f(s.mnn_seconds, '.3f')} s, simulator {_f(s.qnn_seconds, '.3f')} s)"
                )
                for d in t.disagreements[:5]:
                    lines.append(
                        f"    row {d.row}: reference {d.ref_token}, hybrid {d.got_token}, reference lead "
                        f"{d.ref_lead:.3g} ({'near-tie, tolerated' if d.tolerated else 'NOT a near-tie'})"
                    )
    g = r.generation
    if g is not None:
        lines += [
            "",
            f"(c) greedy generation, prompt {g.prompt!r} -> ids {g.prompt_ids}, {g.max_new_tokens} new tokens",
        ]
        source = "KV-cache engine" if g.sequence == "engine" else "recompute loop"
        lines.append(f"  cpu    (original model, MNN's {source}): {g.cpu_tokens}")
        lines.append(f"  hybrid (bundle): {' ' * (len(source) + 16)}{g.hybrid_tokens}")
        lines.append("  each step compares both picks and logits on the prefix of cpu's tokens; the CPU's pick is its "
                     "recompute forward's")  # fmt: skip
        lines += [f"  {parting_note(p)}" for p in g.engine_partings]
        if g.first_divergence is not None and not g.followed:
            lines.append("  (the bundle's tokens stop at its own pick; the spec's verify.follow_divergence runs it on)")
        if g.first_divergence is None:
            bad = sum(not s.logits.passed for s in g.steps)
            off = f"; the logits of {bad} of {len(g.steps)} steps out of tolerance" if bad else ""
            lines.append(f"  tokens identical{off}: {_ok(g.passed)}")
        else:
            lines.append(f"  first divergence at new token {g.first_divergence}: {g.divergence_note} {_ok(g.passed)}")
        if g.problem:
            lines.append(f"  problem: {g.problem}")
        if g.steps:
            worst = max(g.steps, key=lambda s: s.logits.severity(r.model_tolerance))
            lines.append(
                f"  per step (same prefix): min cpu top-2 margin {min(s.cpu_margin for s in g.steps):.3g}; "
                f"worst: {worst.logits.describe(r.model_tolerance)}"
            )
        lines.append(
            f"  time: cpu {_f(g.cpu_seconds, '.3f')} s, hybrid {_f(g.hybrid_seconds, '.3f')} s "
            f"({g.hybrid_forwards} forwards)"
        )
    if r.speculation is not None:
        lines += speculation_lines(r.speculation, r.model_tolerance)
    lines += timing_lines(r.timings)
    return "\n".join(lines) + "\n"


def drafter_name(kind: str) -> str:
    """What drafted for a speculating bundle, in a few words."""
    return "Eagle draft" if kind == "eagle" else "n-gram drafts" if kind == "lookahead" else f"{kind} drafts"


def speculation_lines(c: SpeculationCheck, tol: Tolerance) -> list[str]:
    """verify.txt's section on a speculating bundle."""
    tree = f", eagle_topk {c.topk}, eagle_depth {c.depth}" if c.kind == "eagle" else ""
    tree += "".join(f", {k} {v}" for k, v in c.settings.items())
    lines = [
        "",
        f"speculative decoding ({c.kind}): draft_predict_length {c.draft_length}{tree}; the engine verifies a draft "
        f"in one forward of {c.verify_length} rows",
    ]
    if c.tree is not None:
        shape = "a chain (the draft was that sure)" if c.tree.chain else "a tree"
        if c.tree.forked:
            shape += ", its deepest best node swapped for the best branching one"
        lines.append(
            f"  (b) tree-shaped sample (topk {c.tree.topk}, {shape}): tokens {c.tree.tokens}, positions "
            f"{c.tree.positions}, mask rows {[''.join(map(str, r)) for r in c.tree.sees]}"
        )
    t = c.tree_check
    if t is not None:
        if t.outputs:
            lines += [
                "    " + row
                for row in _table(
                    ["output", "shape", "max abs", "rel", "cosine", "result"], _tensor_rows([], t.outputs)
                )
            ]
        if t.top1 is not None:
            lines.append(f"    top-1 agreement {t.top1.agree}/{t.top1.rows} {_ok(t.top1.passed)}")
        if t.problem:
            lines.append(f"    FAIL ({t.problem})")
    if c.cpu_tokens or c.bundle_tokens:
        lines.append(f"  (c) speculative generation, prompt ids {c.prompt_ids}, {len(c.cpu_tokens)} new tokens")
        lines.append(f"    cpu    (original model, plain greedy):      {c.cpu_tokens}")
        lines.append(f"    hybrid (bundle, {drafter_name(c.kind)}, speculative): {c.bundle_tokens}")
        if c.first_difference is None:
            lines.append(f"    tokens identical: {_ok(c.passed)}")
        else:
            lines.append(f"    first difference: {c.difference_note} {_ok(c.passed)}")
        if c.steps:
            worst = max(c.steps, key=lambda s: s.logits.severity(tol))
            lines.append(f"    per step (same prefix): worst {worst.logits.describe(tol)}")
        lines.append(
            f"    the loop's {c.forwards} bundle forwards: {c.replayed_forwards} read from the generation check's pass "
            f"(the same rows, by the causal mask), {c.simulator_forwards} run in the simulator"
        )
        accepted = [f"{r.accepted}/{len(r.draft)}" for r in c.rounds if r.draft]
        lines.append(
            f"    mean accepted tokens per target forward: {_f(c.mean_accepted, '.3f')} ({c.forwards} forwards;"
            f" draft tokens accepted per round: {' '.join(accepted) or 'none drafted'})"
        )
    if c.npu_weight_bytes_per_forward is not None and c.mean_accepted is not None:
        per_token = _f(None if c.npu_weight_bytes_per_token is None else c.npu_weight_bytes_per_token / 1e6, ".2f")
        lines.append(
            f"    NPU weight bytes per generated token: {per_token} MB (per forward "
            f"{c.npu_weight_bytes_per_forward / 1e6:.2f} MB / mean accepted; a size, not a speed)"
        )
    if c.note:
        lines.append(f"  {c.note}")
    if c.problem:
        lines.append(f"  problem: {c.problem}")
    lines.append(f"  speculation: {_ok(c.passed)}" + ("" if c.seconds is None else f" in {c.seconds:.1f} s"))
    return lines
