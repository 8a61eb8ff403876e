"""The partition report: ``partition.json`` (``PartitionReport``) and a readable ``partition.txt``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mnnbuild.manifests.partition import ShippedWeights
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.mnn.summary import op_parameter_count, op_weight_bytes, subgraph_weight_bytes
from mnnbuild.partition.cut import Cut, Module
from mnnbuild.partition.records import (
    BoundaryShapes,
    CpuOpReport,
    PartitionReport,
    PluginReport,
    TensorSpec,
    binary_path,
    graph_name,
)
from mnnbuild.pipeline.layout import LLM_GRAPHS

_SUBGRAPH_HOLDERS = frozenset({"MoE", "While", "If"})


def weight_ops(cut: Cut, m: Module) -> set[int]:
    """The module's ops plus the Const ops whose tensors it reads."""
    ops = cut.model.ops
    const_producer = {t: i for i, op in enumerate(ops) if op.type in CONST_OP_TYPES for t in op.outputs}
    return set(m.ops) | {const_producer[t] for t in m.consumed if t in const_producer}


def module_weight_bytes(cut: Cut, m: Module) -> int:
    """Bytes of the module's parameters and of the Const tensors it reads."""
    return sum(op_weight_bytes(cut.model.ops[i]) for i in weight_ops(cut, m))


def _boundary(specs: Sequence[Sequence[TensorSpec]]) -> list[BoundaryShapes]:
    first = specs[0]
    return [
        BoundaryShapes(
            name=spec.name,
            qnn_name=spec.qnn_name,
            shapes=[s[j].shape for s in specs],
            dtype=spec.dtype,
            format=spec.format,
        )
        for j, spec in enumerate(first)
    ]


def build_report(
    model_name: str,
    cut: Cut,
    seq_lens: Sequence[int],
    graphs: dict[int, list[int]],
    boundary: dict[int, tuple[list[list[TensorSpec]], list[list[TensorSpec]]]],
    result_ops: int,
    max_abs_diff: Sequence[float],
    prefix: str = LLM_GRAPHS,
) -> PartitionReport:
    """``graphs`` maps plugin number -> the samples it has a graph for, ``boundary`` -> (inputs per graph, outputs
    per graph); ``prefix`` names the graphs."""
    ops = cut.model.ops
    plugins = []
    for m in cut.plugins:
        assert m.graph is not None
        ins, outs = boundary[m.graph]
        plugins.append(
            PluginReport(
                plugin=m.graph,
                name=binary_path(m.graph, prefix),
                graphs=[graph_name(s, m.graph, prefix) for s in graphs[m.graph]],
                op_count=len(m.ops),
                op_types=dict(Counter(ops[i].type for i in m.ops).most_common()),
                first_op=ops[m.ops[0]].name,
                last_op=ops[m.ops[-1]].name,
                inputs=_boundary(ins),
                outputs=_boundary(outs),
                weight_bytes=module_weight_bytes(cut, m),
                parameters=sum(op_parameter_count(cut.model.ops[i]) for i in weight_ops(cut, m)),
            )
        )
    total = sum(op_weight_bytes(op) for op in ops)
    on_npu = set().union(*(weight_ops(cut, m) for m in cut.plugins)) if cut.plugins else set()
    on_cpu: Counter[str] = Counter()
    for i, op in enumerate(ops):
        if i not in on_npu and op.type not in CONST_OP_TYPES and (b := op_weight_bytes(op)):
            on_cpu[op.type] += b
    in_subgraphs = subgraph_weight_bytes(cut.model)
    if in_subgraphs:  # run by the ops that hold subgraphs, which have no lowering (MoE, While, If)
        holders = sorted({op.type for op in ops if op.type in _SUBGRAPH_HOLDERS}) or ["subgraph"]
        on_cpu[" / ".join(holders)] += in_subgraphs
    return PartitionReport(
        model=model_name,
        sample_shapes=list(seq_lens),
        source_ops=len(ops),
        needed_ops=len(cut.needed),
        folded_ops=len(cut.folded_ops),
        plugins=plugins,
        cpu_ops=[CpuOpReport(index=c.index, name=c.name, type=c.type, reason=c.reason) for c in cut.cpu_op_infos()],
        npu_op_count=sum(p.op_count for p in plugins),
        npu_weight_bytes=sum(op_weight_bytes(ops[i]) for i in on_npu),
        total_weight_bytes=total,
        result_ops=result_ops,
        max_abs_diff=list(max_abs_diff),
        moved_ops=cut.moved_ops,
        subgraph_weight_bytes=in_subgraphs,
        cpu_weight_bytes=dict(on_cpu.most_common()),
    )


def _shapes(b: BoundaryShapes) -> str:
    return " | ".join("x".join(str(d) for d in s) or "scalar" for s in b.shapes)


def format_report(report: PartitionReport, result_model: str, weights: ShippedWeights | None = None) -> str:
    """A plain-text table of the report; ``result_model`` is the partitioned graph's path (``qnn/llm.mnn``),
    ``weights`` the weight file shipped with it."""
    seqs = ", ".join(str(s) for s in report.sample_shapes)
    lines = [
        f"partition of {report.model}: sample shapes (seq) {seqs}",
        report.cpu_summary(),
        f"source ops {report.source_ops}, needed {report.needed_ops}, folded per shape {report.folded_ops}, "
        f"{result_model} ops {report.result_ops}",
        f"NPU: {len(report.plugins)} plugins, {report.npu_op_count} ops, "
        f"{report.npu_weight_bytes} of {report.total_weight_bytes} weight bytes",
        "chained subgraph outputs vs sample output.mnn, max abs diff: "
        + ", ".join(f"{d:.3g}" for d in report.max_abs_diff),
        *(
            [
                f"weight file shipped: {weights.file}, {weights.bytes} of the source's {weights.source_bytes} bytes "
                f"({weights.bytes / max(1, weights.source_bytes):.1%}): tied embeddings {weights.tie_embedding_bytes}, "
                f"CPU ops {weights.cpu_op_bytes}"
            ]
            if weights is not None
            else []
        ),
        f"op order: ops that stay on the CPU run as early as their inputs allow, then the NPU runs are cut "
        f"({report.moved_ops} ops moved ahead of the source order)",
        "",
        f"{'plugin':<18} {'ops':>5} {'weight bytes':>13}  op types",
    ]
    for p in report.plugins:
        types = ", ".join(f"{t} {n}" for t, n in p.op_types.items())
        lines.append(f"{p.name:<18} {p.op_count:>5} {p.weight_bytes:>13}  {types}")
        lines.append(f"    ops {p.first_op} .. {p.last_op}; graphs {', '.join(p.graphs)}")
        for label, items in (("in ", p.inputs), ("out", p.outputs)):
            for b in items:
                lines.append(f"    {label} {b.qnn_name:<7} {b.dtype:<8} {b.format:<7} {_shapes(b):<28} {b.name}")
    lines += ["", f"ops left on the CPU ({len(report.cpu_ops)}):"]
    for c in report.cpu_ops:
        lines.append(f"  #{c.index:<5} {c.type:<14} {c.name}: {c.reason}")
    return "\n".join(lines) + "\n"
