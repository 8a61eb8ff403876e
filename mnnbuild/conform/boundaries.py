"""Our plugin boundaries next to those of MNN's own partitioner, ``compilefornpu``, on the same model.

``compilefornpu`` is run as upstream's ``transformers/llm/export/npu/generate_llm_qnn.py`` runs it (steps 1
and 2 of its four): ``generateIO`` writes one sample per shape (a prefill chunk, then one decode token) into
``testdir/<i>/``, then ``compilefornpu src.mnn qnn/llm.mnn qnn.json`` cuts the model, with graph name
``graphllm`` and our partition's ``skips`` and ``max_kv_size`` (``KVCACHE_SIZE_LIMIT``). Its step 3 (QNN
compile) is not needed for boundaries: where the cut falls depends only on the graph (break ops, shape-content
splits, modules without a Convolution), not on the backend, so it runs without MNN's QNN convert mode (the
build's QNN backend is the plugin runtime; the submodules' test runs fall back to the CPU).

Both results are read the same way, from their ``qnn/llm.mnn``: per Plugin op its binary, graph names, boundary
tensors (``t<index>`` of the source model, which both keep), per-shape output dims and layouts, the source ops
it computes (walked back from its outputs to its inputs in the source graph), and the ops left on the CPU.
Not a gate: the report lists the differences, docs/conformance.md says which matter.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, computed_field

from mnnbuild.base.errors import BoundaryError, MnnbuildError
from mnnbuild.base.fsutil import atomic_write_text, parse_json
from mnnbuild.conform.build import MnnBuild, ensure_tools
from mnnbuild.conform.workdir import fresh_dir
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.mnn import schema
from mnnbuild.mnn.model import MnnModel, Op, blob_format, enum_name, load_model, plugin_attributes
from mnnbuild.model.modeldir import ModelPart, read_llm_config
from mnnbuild.pipeline.layout import PARTITION_REPORT_JSON, POSTREAT_FILE, manifest_file

log = logging.getLogger(__name__)

#: What upstream's export script names the LLM's graphs (``graphllm0``, ``graphllm1_0``, ...).
UPSTREAM_GRAPH_NAME = "graphllm"
UPSTREAM_TOOLS = ("generateIO", "compilefornpu")
TOOL_TIMEOUT_S = 3600
TEXT_LLM = ModelPart()
"""The graph upstream's tools are compared on: a text LLM's ``llm.mnn`` (``upstream_io_config`` asks for logits)."""
#: Ops that compute nothing a plugin or the CPU has to run (model inputs, constants).
_NOT_COMPUTE = ("Input", "Const", "TrainableParam")


class PluginOutput(BaseModel):
    tensor: str
    """``t<index> <name>`` in the source model."""
    shapes: dict[int, str]
    """Per sample sequence length: ``dims layout dtype`` (e.g. ``128x64x1x1 NC4HW4 float32``)."""


class PluginSide(BaseModel):
    binary: str
    graphs: list[str]
    seq_order: list[int]
    """The sample sequence lengths in graph order (``graphs[i]`` was compiled for ``seq_order[i]``)."""
    inputs: list[str]
    outputs: list[PluginOutput]
    ops: list[str]
    """Source ops the plugin computes, ``Type name``, in source order."""


class PartitionSide(BaseModel):
    plugins: list[PluginSide]
    cpu_ops: list[str]
    """Ops the partitioned model still runs on the CPU (``Type name``), constants and inputs aside."""
    output_names: list[str]
    dangling_outputs: list[str]
    """Output names of the partitioned model that no tensor carries (the engine cannot ask for them)."""
    unused_constants: int
    """Const ops whose value no op reads (left behind by folding)."""


class PluginDiff(BaseModel):
    plugin: int
    ours: str
    upstream: str
    inputs_only_ours: list[str] = []
    inputs_only_upstream: list[str] = []
    outputs_only_ours: list[str] = []
    outputs_only_upstream: list[str] = []
    ops_only_ours: list[str] = []
    """Source ops inside our plugin that upstream runs elsewhere (another plugin or the CPU)."""
    ops_only_upstream: list[str] = []
    shape_mismatches: list[str] = []
    """Shared outputs whose dims, layout or dtype differ for a sequence length both compiled."""

    @computed_field
    @property
    def same_cut(self) -> bool:
        """The same boundary tensors, ops and output shapes (names and graph order aside)."""
        return not (
            self.inputs_only_ours
            or self.inputs_only_upstream
            or self.outputs_only_ours
            or self.outputs_only_upstream
            or self.ops_only_ours
            or self.ops_only_upstream
            or self.shape_mismatches
        )


class BoundaryReport(BaseModel):
    tool: str
    """The ``compilefornpu`` that ran (path in the MNN build)."""
    settings: dict[str, Any]
    """qnn.json as given to compilefornpu."""
    ours: PartitionSide | None = None
    upstream: PartitionSide | None = None
    plugins: list[PluginDiff] = []
    cpu_only_ours: list[str] = []
    """Ops on the CPU in our partition but not in upstream's."""
    cpu_reasons: dict[str, str] = {}
    """Our partition's recorded reason for each of ``cpu_only_ours``."""
    cpu_only_upstream: list[str] = []
    differences: list[str] = []
    """Every difference, one line each (plugin count, graph names, shape order, boundaries, ops, outputs)."""
    problem: str | None = None
    """Why no comparison was made (compilefornpu failed, a model it does not take), else None."""


# ---- running upstream's partitioner ---------------------------------------------------------------


def upstream_io_config(llm_config: dict[str, Any], chunk: int) -> dict[str, Any]:
    """The ``input.json`` upstream's export script gives ``generateIO`` for a text LLM: a prefill chunk, then a
    decode step, each asking for ``logits`` (the last row for prefill via ``logits_index`` 0, -1 for decode)."""
    hidden = llm_config.get("hidden_size")
    if not isinstance(hidden, int) or hidden <= 0:
        raise BoundaryError("llm_config.json: field 'hidden_size' must be a positive integer")
    mask_type = llm_config.get("attention_mask", "int")

    def sample(seq: int, logits_index: int) -> dict[str, Any]:
        return {
            "inputs": [
                {"name": "input_ids", "shape": [seq, 1, hidden]},
                {"name": "attention_mask", "shape": [1, 1, seq, seq], "type": mask_type},
                {"name": "position_ids", "shape": [1, seq], "type": "int"},
                {"name": "logits_index", "shape": [1], "type": "int", "value": logits_index},
            ],
            "outputs": ["logits"],
        }

    return {"configs": [sample(chunk, 0), sample(1, -1)]}


def _run_tool(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path, what: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, env=env, timeout=TOOL_TIMEOUT_S, check=False)
    text = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
    with log_path.open("a", encoding="utf-8") as fh:
        fh.write("$ " + " ".join(cmd) + "\n" + text + "\n")
    if proc.returncode != 0:
        tail = " | ".join(ln.strip() for ln in text.splitlines() if ln.strip())[-300:]
        raise BoundaryError(f"{what} exited {proc.returncode} (log {log_path}): {tail}")


def run_compilefornpu(
    build: MnnBuild, model_dir: Path, work: Path, chunk: int, skips: list[str], max_kv_size: int, env: dict[str, str]
) -> Path:
    """Cut ``model_dir/llm.mnn`` with upstream's tools in ``work``; returns ``work`` (``qnn/llm.mnn`` and
    ``npu_postreat.json`` in it). The model dir is only read."""
    llm_config = read_llm_config(model_dir)
    if llm_config.get("is_mrope") or llm_config.get("is_visual"):
        raise BoundaryError("a model with M-RoPE inputs needs another input.json; only text LLMs are compared")
    ensure_tools(build, UPSTREAM_TOOLS)
    fresh_dir(work)  # conform's own subdir of its report dir: --out may name a directory of the user's
    (work / "qnn").mkdir()
    log_path = work / "tools.log"
    atomic_write_text(work / "input.json", json.dumps(upstream_io_config(llm_config, chunk), indent=2) + "\n")
    model, weight = (model_dir / TEXT_LLM.model_file).resolve(), (model_dir / TEXT_LLM.weight_file).resolve()
    _run_tool(
        [str(build.tool("generateIO")), str(model), "input.json", "testdir", str(weight)],
        work,
        env,
        log_path,
        "generateIO",
    )
    settings = qnn_json(skips, max_kv_size)
    atomic_write_text(work / "qnn.json", json.dumps(settings, indent=2) + "\n")
    _run_tool(
        [str(build.tool("compilefornpu")), str(model), TEXT_LLM.result_model, "qnn.json"],
        work,
        env,
        log_path,
        "compilefornpu",
    )
    for rel in (TEXT_LLM.result_model, POSTREAT_FILE):
        if not (work / rel).is_file():
            raise BoundaryError(f"compilefornpu wrote no {rel} (log {log_path})")
    return work


def qnn_json(skips: list[str], max_kv_size: int) -> dict[str, Any]:
    """compilefornpu's settings as upstream's export script writes them, with our partition's skips and KV limit."""
    return {
        "type": "QNN",
        "skips": list(skips),
        "testdir": ["testdir/0", "testdir/1"],
        "KVCACHE_SIZE_LIMIT": max_kv_size,
        "cache": "qnn",
        "graph_name": UPSTREAM_GRAPH_NAME,
    }


# ---- reading a partitioned model ------------------------------------------------------------------


def _label(op: Op) -> str:
    return f"{op.type} {op.name}"


def _source_index(qnn_name: str, where: str) -> int:
    if not qnn_name.startswith("t") or not qnn_name[1:].isdigit():
        raise BoundaryError(f"{where}: plugin tensor {qnn_name!r} is not t<source tensor index>")
    return int(qnn_name[1:])


def plugin_ops(source: MnnModel, inputs: set[int], outputs: set[int]) -> list[str]:
    """Source ops between ``inputs`` and ``outputs``: walked back from the outputs, stopping at the inputs."""
    producer = {t: i for i, op in enumerate(source.ops) for t in op.outputs}
    seen: set[int] = set()
    stack = [t for t in outputs if t in producer]
    while stack:
        t = stack.pop()
        if t in inputs or t not in producer or producer[t] in seen:
            continue
        op_index = producer[t]
        op = source.ops[op_index]
        if op.type in _NOT_COMPUTE:
            continue
        seen.add(op_index)
        stack.extend(op.inputs)
    return [_label(source.ops[i]) for i in sorted(seen)]


def _describe_blob(blob: Any) -> str:
    dims = "x".join(str(int(d)) for d in (blob.dims if blob.dims is not None else []))
    return f"{dims or 'scalar'} {blob_format(blob)} {enum_name(schema.DataType, int(blob.dataType))}"


def read_side(result: MnnModel, source: MnnModel, seq_order: list[int]) -> PartitionSide:
    """One partition (``qnn/llm.mnn``) described against its source model; ``seq_order`` is the sample
    sequence lengths in shape-index order (the ``o_<shape>_<j>`` attributes)."""
    where = str(result.path or "qnn/llm.mnn")
    names = source.tensor_names

    def tensor(index: int) -> str:
        if not 0 <= index < len(names):
            raise BoundaryError(f"{where}: plugin tensor t{index} is not a tensor of the source model")
        return f"t{index} {names[index]}"

    plugins = []
    for op in result.ops_of_type("Plugin"):
        attrs = plugin_attributes(op)
        ins = [_source_index(s, where) for s in attrs.get("inputs", [])]
        outs = [_source_index(s, where) for s in attrs.get("outputs", [])]
        outputs = []
        for j, t in enumerate(outs):
            shapes = {}
            for s, seq in enumerate(seq_order):
                blob = attrs.get(f"o_{s}_{j}")
                if blob is not None:
                    shapes[seq] = _describe_blob(blob)
            outputs.append(PluginOutput(tensor=tensor(t), shapes=shapes))
        plugins.append(
            PluginSide(
                binary=str(attrs.get("path", op.name)),
                graphs=list(attrs.get("allGraphName", [])),
                seq_order=seq_order,
                inputs=[tensor(t) for t in ins],
                outputs=outputs,
                ops=plugin_ops(source, set(ins), set(outs)),
            )
        )
    cpu = [_label(op) for op in result.ops if op.type not in (*_NOT_COMPUTE, "Plugin")]
    tensor_names = set(result.tensor_names)
    read = {t for op in result.ops for t in op.inputs}
    outputs = {i for i, n in enumerate(result.tensor_names) if n in set(result.output_names)}
    unused = [op for op in result.ops if op.type == "Const" and not set(op.outputs) & (read | outputs)]
    return PartitionSide(
        plugins=plugins,
        cpu_ops=cpu,
        output_names=list(result.output_names),
        dangling_outputs=[n for n in result.output_names if n not in tensor_names],
        unused_constants=len(unused),
    )


# ---- comparing --------------------------------------------------------------------------------------


def _only(a: list[str], b: list[str]) -> list[str]:
    other = set(b)
    return [x for x in a if x not in other]


def diff_plugin(i: int, ours: PluginSide, upstream: PluginSide) -> PluginDiff:
    d = PluginDiff(
        plugin=i,
        ours=ours.binary,
        upstream=upstream.binary,
        inputs_only_ours=_only(ours.inputs, upstream.inputs),
        inputs_only_upstream=_only(upstream.inputs, ours.inputs),
        outputs_only_ours=_only([o.tensor for o in ours.outputs], [o.tensor for o in upstream.outputs]),
        outputs_only_upstream=_only([o.tensor for o in upstream.outputs], [o.tensor for o in ours.outputs]),
        ops_only_ours=_only(ours.ops, upstream.ops),
        ops_only_upstream=_only(upstream.ops, ours.ops),
    )
    theirs = {o.tensor: o for o in upstream.outputs}
    for o in ours.outputs:
        u = theirs.get(o.tensor)
        if u is None:
            continue
        for seq in sorted(set(o.shapes) & set(u.shapes)):
            if o.shapes[seq] != u.shapes[seq]:
                d.shape_mismatches.append(f"{o.tensor} at seq {seq}: ours {o.shapes[seq]}, upstream {u.shapes[seq]}")
    return d


def compare_sides(ours: PartitionSide, upstream: PartitionSide, cpu_reasons: dict[str, str]) -> BoundaryReport:
    """Differences plugin by plugin (paired in op order), then the CPU ops and the model outputs."""
    report = BoundaryReport(tool="", settings={}, ours=ours, upstream=upstream)
    lines = report.differences
    if len(ours.plugins) != len(upstream.plugins):
        lines.append(f"plugin count: ours {len(ours.plugins)}, upstream {len(upstream.plugins)}")
    for i, (o, u) in enumerate(zip(ours.plugins, upstream.plugins, strict=False)):
        d = diff_plugin(i, o, u)
        report.plugins.append(d)
        if o.graphs != u.graphs or o.binary != u.binary:
            lines.append(f"plugin {i} names: ours {o.binary} {o.graphs}, upstream {u.binary} {u.graphs}")
        if o.seq_order != u.seq_order:
            lines.append(f"plugin {i} shape order (seq per graph): ours {o.seq_order}, upstream {u.seq_order}")
        for field, label in (
            ("inputs_only_ours", "inputs only ours"),
            ("inputs_only_upstream", "inputs only upstream"),
            ("outputs_only_ours", "outputs only ours"),
            ("outputs_only_upstream", "outputs only upstream"),
            ("ops_only_ours", "ops only in our plugin"),
            ("ops_only_upstream", "ops only in upstream's plugin"),
            ("shape_mismatches", "output shapes differ"),
        ):
            values = getattr(d, field)
            if values:
                lines.append(f"plugin {i} {label}: {', '.join(values)}")
    report.cpu_only_ours = _only(ours.cpu_ops, upstream.cpu_ops)
    report.cpu_reasons = {op: cpu_reasons[op] for op in report.cpu_only_ours if op in cpu_reasons}
    report.cpu_only_upstream = _only(upstream.cpu_ops, ours.cpu_ops)
    by_reason: dict[str, list[str]] = {}
    for op in report.cpu_only_ours:
        by_reason.setdefault(report.cpu_reasons.get(op, "no reason recorded"), []).append(op)
    for reason, ops in by_reason.items():
        lines.append(f"CPU ops only ours: {', '.join(ops)} (ours: {reason})")
    if report.cpu_only_upstream:
        lines.append(f"CPU ops only upstream: {', '.join(report.cpu_only_upstream)}")
    if ours.unused_constants != upstream.unused_constants:
        lines.append(f"unused Const ops: ours {ours.unused_constants}, upstream {upstream.unused_constants}")
    for side, label in ((ours, "ours"), (upstream, "upstream")):
        if side.dangling_outputs:
            lines.append(f"{label}: model output names carried by no tensor: {', '.join(side.dangling_outputs)}")
    return report


def _cpu_reasons(partition_dir: Path) -> dict[str, str]:
    """Our partition's recorded reason per CPU op (``Type name`` -> reason); empty if the report is unreadable."""
    try:
        doc = parse_json((partition_dir / PARTITION_REPORT_JSON).read_text(encoding="utf-8"))
        return {f"{c['type']} {c['name']}": str(c["reason"]) for c in doc.get("cpu_ops", [])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


class CutSettings(BaseModel):
    """What our partition was cut with, as its manifest records it: what compilefornpu is given too."""

    chunk: int
    """The longest prefill length: the one chunk upstream's export script compiles."""
    seq_lens: list[int]
    """Our graphs' sample lengths in shape-index order (decode first, then every prefill length)."""
    skips: list[str]
    max_kv_size: int


def cut_settings(partition_dir: Path) -> CutSettings:
    """Our partition's settings from its manifest; a language model's partition only (its prefill lengths)."""
    try:
        manifest = PartitionManifest.read(partition_dir)
    except MnnbuildError as exc:
        raise BoundaryError(str(exc)) from None
    params = manifest.params
    if not params.chunk_sizes:
        raise BoundaryError(
            f"{partition_dir / manifest_file('partition')}: field 'params.chunk_sizes' is empty: not a language "
            "model's partition"
        )
    return CutSettings(
        chunk=max(params.chunk_sizes),
        seq_lens=list(manifest.seq_lens),
        skips=list(params.skips),
        max_kv_size=params.max_kv_size,
    )


def compare_cuts(original_dir: Path, partition_dir: Path, upstream_model: Path, cut: CutSettings) -> BoundaryReport:
    """Our partition next to the model upstream's compilefornpu wrote (``upstream_model``, its ``qnn/llm.mnn``), both
    read against the original model."""
    source = load_model(original_dir / TEXT_LLM.model_file)
    # compilefornpu keeps output names it cut away (no tensor carries them): read its model leniently
    upstream = read_side(load_model(upstream_model, check_outputs=False), source, [cut.chunk, 1])
    ours = read_side(load_model(partition_dir / TEXT_LLM.result_model), source, cut.seq_lens)
    report = compare_sides(ours, upstream, _cpu_reasons(partition_dir))
    report.settings = qnn_json(cut.skips, cut.max_kv_size)
    return report


def compare_boundaries(
    build: MnnBuild, original_dir: Path, partition_dir: Path, work: Path, env: dict[str, str]
) -> BoundaryReport:
    """Run compilefornpu on the original model with our partition's settings and compare. A failure of the
    upstream tools is recorded in the report (``problem``), not raised: the comparison is not a gate."""
    tool = str(build.tool("compilefornpu"))
    settings: dict[str, Any] = {}
    try:
        cut = cut_settings(partition_dir)
        settings = qnn_json(cut.skips, cut.max_kv_size)
        run_compilefornpu(build, original_dir, work, cut.chunk, cut.skips, cut.max_kv_size, env)
        report = compare_cuts(original_dir, partition_dir, work / TEXT_LLM.result_model, cut)
    except MnnbuildError as exc:
        log.warning("conform: no boundary comparison: %s", exc)
        return BoundaryReport(tool=tool, settings=settings, problem=str(exc))
    report.tool = tool
    return report


def format_boundaries(report: BoundaryReport) -> list[str]:
    out = [f"plugin boundaries vs MNN's compilefornpu ({report.tool}):"]
    if report.problem:
        return [*out, f"  not compared: {report.problem}"]
    assert report.ours is not None and report.upstream is not None
    out.append(
        f"  plugins: ours {len(report.ours.plugins)}, upstream {len(report.upstream.plugins)}; "
        f"CPU ops: ours {len(report.ours.cpu_ops)}, upstream {len(report.upstream.cpu_ops)}; "
        f"same cut in {sum(d.same_cut for d in report.plugins)} of {len(report.plugins)} paired plugins"
    )
    out += [f"  - {line}" for line in report.differences] or ["  no differences"]
    return out
