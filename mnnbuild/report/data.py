"""What the page report shows, as plain data: gathered by the report stage, rendered by :mod:`render`.

Nothing here reads files or knows about stages; it only shapes the verify and partition records and the
stage costs into what the page and its figures need.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from mnnbuild.model.npu_weights import WeightNote
from mnnbuild.partition.records import PartitionReport
from mnnbuild.pipeline.manifest import FileRecord
from mnnbuild.verify.verdict import VerifyReport, parting_note, shape_label

CPU = "CPU"


class OpCell(BaseModel):
    """One op of the source model in the partition strip: where it runs and, on the CPU, why."""

    index: int
    name: str
    type: str
    where: str
    """``CPU`` or the plugin's binary path (``qnn/graphllm<k>.bin``)."""
    reason: str | None = None


class StageCost(BaseModel):
    """One stage directory's cost, from its manifest (bytes written) and origin record (how it came to be)."""

    stage: str
    label: str
    """The stage with its part, e.g. ``context graphllm0``."""
    status: str
    """``built`` or ``from cache`` in the run that last ran verify, ``up to date`` (made by an earlier run),
    ``failed`` or ``missing``."""
    at: str | None = None
    seconds: float | None = None
    peak_rss: int | None = None
    bytes_written: int = 0
    files: int = 0


class ReportData(BaseModel):
    model: str
    target: str
    verify: VerifyReport
    partition: PartitionReport
    ops: list[OpCell]
    plugin_binaries: dict[str, int] = Field(default_factory=dict)
    """Shipped context binary size by plugin path (``qnn/graphllm<k>.bin``)."""
    bundle_files: list[FileRecord] = Field(default_factory=list)
    """Every file of the bundle stage's manifest (the device dir and the scripts), as the integrity check counts."""
    bundle_path: str = ""
    """The bundle's model dir relative to the page (``../bundle/model/<name>/``)."""
    bundle_qnn_build: str | None = None
    plugin_weights: dict[str, list[WeightNote]] = Field(default_factory=dict)
    """How each plugin's shipped binary stores its conv weights (its context manifest's notes), by plugin path."""
    costs: list[StageCost] = Field(default_factory=list)

    @property
    def plugins(self) -> list[str]:
        return [p.name for p in self.partition.plugins]

    def weight_encoding(self, plugin: str) -> str:
        """One line saying how ``plugin`` stores its conv weights: each encoding with its count, whether it holds
        the model's own codes (or its requantization error), and why a weight stayed float16."""
        groups: dict[tuple[str, int, bool], list[WeightNote]] = {}
        for note in self.plugin_weights.get(plugin, []):
            groups.setdefault((note.encoding, note.bitwidth, note.centered), []).append(note)
        parts = []
        for (encoding, bits, centered), notes in groups.items():
            what = f"{encoding} {bits}-bit{' on the input centered per block' if centered else ''} x{len(notes)}"
            if encoding == "float16":
                reasons = sorted({n.reason for n in notes if n.reason})
                parts.append(what + (f" ({'; '.join(reasons)})" if reasons else ""))
            elif all(n.exact for n in notes):
                folded = max((n.error for n in notes if n.folded), default=None)
                sums = "" if folded is None else f"; block sums in 4-bit digits, max error {folded:.1e}"
                parts.append(what + f" (the model's codes{sums})")
            else:
                parts.append(what + f" (requantized, max error {max(n.error for n in notes):.1e})")
        return ", ".join(parts) or "n/a"

    def bundle_parts(self) -> list[tuple[str, int]]:
        """The device dir's bytes by part: context binaries, the weight file(s) the CPU ops read, qnn/llm.mnn, the
        rest."""
        sizes = {"context binaries (qnn/*.bin)": 0, "CPU weights (*.weight, embeddings)": 0, "qnn/llm.mnn": 0}
        rest = 0
        for r in self.bundle_files:
            name = r.path.split("/", 2)[-1]  # model/<name>/<file>
            if name.startswith("qnn/") and name.endswith(".bin"):
                sizes["context binaries (qnn/*.bin)"] += r.size
            elif name.endswith(".weight") or name.startswith("embeddings_"):
                sizes["CPU weights (*.weight, embeddings)"] += r.size
            elif name == "qnn/llm.mnn":
                sizes["qnn/llm.mnn"] += r.size
            else:
                rest += r.size
        return [*sizes.items(), ("the rest (configs, tokenizer, ...)", rest)]

    def check_verdicts(self) -> list[tuple[str, bool | None, str]]:
        """(check, passed or None when it did not run, one-line detail), in verify's order."""
        v = self.verify
        rows: list[tuple[str, bool | None, str]] = []
        if v.integrity is not None:
            rows.append(
                (
                    "bundle integrity",
                    v.integrity.passed,
                    f"{v.integrity.files} files vs the bundle manifest" + ("" if v.integrity.passed else " differ"),
                )
            )
        else:
            rows.append(("bundle integrity", None, "not run"))
        bad_plugins = [p.path for p in v.plugins if not p.passed]
        rows.append(
            (
                "plugins (sha256, binary info)",
                (not bad_plugins) if v.plugins else None,
                f"{len(v.plugins)} binaries" + (f"; failing: {', '.join(bad_plugins)}" if bad_plugins else ""),
            )
        )
        graph_outputs = [t for g in v.graphs for t in g.outputs]
        rows.append(
            (
                "(a) per graph vs reference",
                all(g.passed for g in v.graphs) if v.graphs else None,
                f"{len(v.graphs)} graphs, {len(graph_outputs)} outputs",
            )
        )
        rows.append(
            (
                "(b) whole model vs MNN CPU",
                all(s.passed for s in v.whole_model) if v.whole_model else None,
                ", ".join(f"seq {shape_label(s)}" for s in v.whole_model) or "not run",
            )
        )
        gen = v.generation
        rows.append(("(c) greedy generation", gen.passed if gen is not None else None, generation_detail(v)))
        if v.speculation is not None:  # only a bundle that speculates has this row
            rows.append(("speculative decoding", v.speculation.passed, speculation_detail(v)))
        return rows


def speculation_detail(v: VerifyReport) -> str:
    """The speculation row's detail: the tree sample, the tokens against plain greedy, and what speculation buys."""
    c = v.speculation
    if c is None:
        return "not run"
    if c.problem:
        return c.problem
    if c.note:
        return c.note
    parts = []
    if c.tree_check is not None:
        shape = "chain" if c.tree is not None and c.tree.chain else "tree"
        shape += " (forked)" if c.tree is not None and c.tree.forked else ""
        parts.append(f"{shape} sample at {c.verify_length} rows {'within' if c.tree_check.passed else 'OUT OF'} "
                     "tolerance")  # fmt: skip
    if c.first_difference is None:
        parts.append(f"speculative tokens = plain greedy ({len(c.bundle_tokens)} tokens)")
    else:
        parts.append(c.difference_note or f"tokens differ from new token {c.first_difference}")
    if c.mean_accepted is not None:
        parts.append(f"{c.mean_accepted:.2f} tokens per target forward")
    if c.npu_weight_bytes_per_token is not None:
        parts.append(f"{c.npu_weight_bytes_per_token / 1e6:.2f} MB NPU weights per token (a size)")
    return "; ".join(parts)


def generation_detail(v: VerifyReport) -> str:
    """Row (c)'s detail: what the tokens did and, when the row fails, why (never "identical tokens" alone beside
    a FAIL: the logits can be out of tolerance while every token agrees)."""
    gen = v.generation
    if gen is None:
        return "not run"
    if gen.problem:
        return gen.problem
    first = None if gen.first_divergence is None else gen.steps[gen.first_divergence]
    if first is None:
        tokens = f"identical tokens ({len(gen.steps)} steps)"
    elif first.tolerated_flip:
        tokens = f"tokens differ from new token {first.step} at a tolerated near-tie"
    elif first.hybrid_pick == first.cpu_token:
        tokens = f"tokens differ from new token {first.step}, where the bundle picks the CPU forward's token"
    else:
        tokens = f"tokens differ from new token {first.step}"
    flips = gen.bad_flips
    if flips and (first is None or flips[0].step != first.step):
        tokens += f", the bundle's pick differs from the CPU's beyond a near-tie at new token {flips[0].step}"
    bad = [s for s in gen.steps if not s.logits.passed]
    if bad:
        tokens += f", but the logits of {len(bad)} of {len(gen.steps)} steps are out of tolerance"
    for p in gen.engine_partings:
        tokens += f"; {parting_note(p)}"
    return tokens


def op_strip(partition: PartitionReport, plugin_cells: list[OpCell]) -> list[OpCell]:
    """The source model's ops that run (on the CPU or in a plugin), in source order.

    ``plugin_cells`` are the ops of each plugin's decode graph. Ops folded away per shape (shape arithmetic)
    and constants are not in the strip.
    """
    cpu = [OpCell(index=c.index, name=c.name, type=c.type, where=CPU, reason=c.reason) for c in partition.cpu_ops]
    return sorted([*cpu, *plugin_cells], key=lambda c: c.index)


def runs(cells: list[OpCell]) -> list[tuple[int, int, str]]:
    """Consecutive cells with one ``where``: (start position, length, where)."""
    out: list[tuple[int, int, str]] = []
    for pos, cell in enumerate(cells):
        if out and out[-1][2] == cell.where and out[-1][0] + out[-1][1] == pos:
            out[-1] = (out[-1][0], out[-1][1] + 1, cell.where)
        else:
            out.append((pos, 1, cell.where))
    return out
