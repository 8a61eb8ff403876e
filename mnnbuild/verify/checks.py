"""The checks of the verify stage. Each returns report records and never raises on a failed check:
a check that cannot run records why, so the report is always complete.

The x86 HTP library cannot load weight-shared context binaries (``mnnbuild/qnn/README.md``), so the
numbers come from *unshared twins*: the same graphs and weights composed with weight sharing off, which the
twin stage writes, one per plugin (:func:`read_twins`; verify composes nothing). The shipped binaries are
tied to them by hash (context manifest = bundle manifest = file; the twin's own hash in the twin manifest)
and by structure (binary info checked against the plugin attributes by the
runtime's ``check_structure``, for the shipped binary and the twin alike).

The simulator work is one pass (see ``mnnbuild.stages.verify``): the bundle runs every io sample and the
generation sequence in lockstep, one plugin context loaded at a time. The per-graph check uses that pass's
executions (:func:`check_graph_runs`): each graph's outputs against its source ops run on the CPU on the
same inputs, so a graph's own error is measured without a simulator run of its own (the simulator is the slow
part of verify, its graphs' CPU ops a fraction of it: docs/benchmarks.md). Only a graph no pass
ran is run alone, on the partition's reference inputs (:func:`check_plugin_graphs`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mnnbuild_runtime import (
    Embeddings,
    ForwardResult,
    HybridModel,
    Tokenizer,
    cpu_forward_fn,
    draft_feeds,
    draft_rows,
    follow_draft,
    kv_cache_redraft,
    loop_redraft,
    text_feeds,
)
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.generate import ForwardFn, GenerationResult, Redraft
from mnnbuild_runtime.hashes import FileHashes, KnownHash
from mnnbuild_runtime.twins import Twin as RuntimeTwin
from mnnbuild_runtime.twins import twin_of

from mnnbuild.base.compare import Tolerance, compare
from mnnbuild.base.errors import ToleranceError, UnsafePathError, UpstreamError
from mnnbuild.base.fsutil import confined, file_stamp, sha256_file
from mnnbuild.cpu import CpuRuntime, load_vars
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.partition.reference import SourceSubgraphRunner
from mnnbuild.pipeline.layout import (
    CONFIG_FILE,
    QNN_DIR,
    REFERENCE_INPUT,
    REFERENCE_OUTPUT,
    manifest_file,
    origin_file,
    plugin_context_dir,
)
from mnnbuild.pipeline.manifest import FileRecord
from mnnbuild.pipeline.origin import trusted_hashes
from mnnbuild.qnn import ContextRunner, QnnLibrary, read_binary_info
from mnnbuild.verify.compare import is_near_tie, lead, row_errors, top2_margin
from mnnbuild.verify.reference import (
    Draft,
    InProcessReference,
    Reference,
    ReferenceJob,
    ReferenceSpec,
    describe_error,
    start_reference,
)
from mnnbuild.verify.verdict import (
    EngineParting,
    GenerationCheck,
    GenerationStep,
    GraphCheck,
    IntegrityCheck,
    PluginCheck,
    ShapeCheck,
    Top1Check,
    Top1Disagreement,
)

log = logging.getLogger(__name__)

# Files a stage adds next to its outputs after recording them (not part of the bundle itself).
_BOOKKEEPING = (manifest_file("bundle"), origin_file("bundle"))


def check_integrity(
    bundle_dir: Path, records: list[FileRecord], trusted: Mapping[str, list[int]] | None = None
) -> IntegrityCheck:
    """Every file the bundle manifest lists must be there with its size and sha256; nothing else may be
    (:func:`integrity_hashes`, without the hashes)."""
    return integrity_hashes(bundle_dir, records, trusted)[0]


def integrity_passed(bundle_dir: Path, records: list[FileRecord], trusted: Mapping[str, list[int]]) -> bool:
    """Whether the bundle dir passes `check_integrity` (`Stage.intact` of verify's guard)."""
    return check_integrity(bundle_dir, records, trusted).passed


def integrity_hashes(
    bundle_dir: Path, records: list[FileRecord], trusted: Mapping[str, list[int]] | None = None
) -> tuple[IntegrityCheck, dict[Path, KnownHash]]:
    """The integrity check, and each file that passed it with its sha256 and the stamp it had when checked, for the
    runtime (`mnnbuild_runtime.hashes`): what verify read again from the bundle is then not hashed again.

    ``trusted``: the `file_stamp` of files hashed when the bundle dir was made (its origin record's ``stamps``): a
    file with that stamp still is what was hashed, and is not hashed again (4.3 GB at Qwen3-1.7B size)."""
    problems = []
    listed = set()
    trusted = trusted or {}
    known: dict[Path, KnownHash] = {}
    hashed = 0
    seconds = 0.0
    for rec in records:
        listed.add(rec.path)
        try:
            path = confined(bundle_dir, rec.path, f"{bundle_dir} manifest")
        except UnsafePathError as exc:
            problems.append(f"bundle file {rec.path}: {exc}")
            continue
        if not path.is_file():
            problems.append(f"bundle file {rec.path}: missing (listed in the bundle manifest)")
            continue
        size = path.stat().st_size
        stamp = trusted.get(rec.path)
        now = file_stamp(path)
        if stamp is not None and stamp == now and size == rec.size:
            known[path] = KnownHash(rec.sha256, tuple(now))
            continue
        t0 = time.perf_counter()
        digest = sha256_file(path)
        seconds += time.perf_counter() - t0
        hashed += 1
        if size != rec.size or digest != rec.sha256:
            problems.append(
                f"bundle file {rec.path}: sha256 {digest[:12]}… ({size} bytes) differs from the bundle manifest's "
                f"{rec.sha256[:12]}… ({rec.size} bytes): changed after bundling"
            )
        elif now is not None and now == file_stamp(path):  # unchanged while hashed: these bytes have that stamp
            known[path] = KnownHash(rec.sha256, tuple(now))
    extra = sorted(
        p.relative_to(bundle_dir).as_posix()
        for p in bundle_dir.rglob("*")
        if p.is_file() and p.name not in _BOOKKEEPING and p.relative_to(bundle_dir).as_posix() not in listed
    )
    problems += [f"bundle file {e}: not listed in the bundle manifest" for e in extra]
    check = IntegrityCheck(files=len(records), hashed=hashed, hash_seconds=seconds, problems=problems,
                           passed=not problems)  # fmt: skip
    return check, known


def twin_hashes(twins: Iterable[RuntimeTwin], twin_dir: Path) -> dict[Path, KnownHash]:
    """Each twin whose file still has the stamp the twin stage's origin record gave it when it hashed it: its
    recorded sha256 with that stamp, for the runtime (the twin is then not hashed again when it loads)."""
    known: dict[Path, KnownHash] = {}
    for twin in twins:
        where = plugin_context_dir(twin_dir, twin.binary)
        stamps = trusted_hashes(where, TwinManifest.stage)
        try:
            rel = twin.path.relative_to(where).as_posix()
        except ValueError:
            continue
        stamp, now = stamps.get(rel), file_stamp(twin.path)
        if stamp is not None and stamp == now:
            known[twin.path] = KnownHash(twin.sha256, tuple(now))
    return known


@dataclass(frozen=True)
class Twin(RuntimeTwin):
    """The runtime's twin record (:mod:`mnnbuild_runtime.twins`, one reading of the twin stage's outputs) with
    the build's view of its manifest."""

    manifest: TwinManifest = field(compare=False, repr=False)
    """The twin manifest (what it was built from, for which SoC)."""


def read_contexts(context_dir: Path, merge: Mapping[str, list[str]]) -> tuple[dict[str, ContextManifest], list[str]]:
    """Each plugin's context manifest, by plugin path; the ones that cannot be read are problems, not errors."""
    contexts: dict[str, ContextManifest] = {}
    problems = []
    for binary in merge:
        try:
            contexts[binary] = ContextManifest.read(plugin_context_dir(context_dir, binary))
        except UpstreamError as exc:
            problems.append(f"plugin {binary}: {exc}")
    return contexts, problems


def read_twins(
    twin_dir: Path, contexts: Mapping[str, ContextManifest], merge: Mapping[str, list[str]]
) -> tuple[dict[str, Twin], list[str]]:
    """Each plugin's twin as its twin manifest (in ``twin_dir``, one subdir per plugin) names and hashes it, tied
    to the shipped binary's hash in its context manifest (nothing is composed here; the runtime's
    :func:`~mnnbuild_runtime.twins.twin_of` reads it); the problems (a missing or foreign twin manifest, a twin it
    does not list, a path leaving its dir) are returned, not raised."""
    twins: dict[str, Twin] = {}
    problems = []
    for binary, graphs in merge.items():
        ctx = contexts.get(binary)
        if ctx is None:
            continue  # no context manifest: reported with the context problems
        try:
            manifest = TwinManifest.read(plugin_context_dir(twin_dir, binary))  # a missing twin first: it names a task
        except UpstreamError as exc:
            problems.append(f"plugin {binary}: {exc}")
            continue
        try:
            shipped = ctx.output(ctx.binary).sha256
        except KeyError:
            problems.append(f"plugin {binary}: its context manifest lists no output {ctx.binary!r}")
            continue
        try:
            found = twin_of(twin_dir, binary, shipped)
        except (UpstreamError, BundleError) as exc:
            problems.append(f"plugin {binary}: {exc}")
            continue
        twins[binary] = Twin(binary, list(graphs), found.path, found.sha256, shipped, manifest)
    return twins, problems


def check_plugin_graphs(
    runner: ContextRunner, binary: str, graphs: Sequence[str], partition_dir: Path, tol: Tolerance
) -> list[GraphCheck]:
    """(a) Every graph of one loaded plugin context on the partition's reference inputs vs its reference outputs."""
    results = []
    for graph in graphs:
        name = Path(graph).name
        try:
            graph_dir = confined(partition_dir, graph, "npu_postreat.json field 'merge'")
            desc = SubgraphRecord.read(graph_dir)
            ins, outs = desc.load_reference(graph_dir)
            ginfo = runner.info.graph(name)
            feed = {
                t.qnn_name: np.ascontiguousarray(a, dtype=ginfo.input(t.qnn_name).numpy_dtype)
                for t, a in zip(desc.inputs, ins, strict=True)
            }
            t0 = time.perf_counter()
            got = runner.execute(name, feed)
            seconds = time.perf_counter() - t0
            checks = [
                compare(t.name, got[t.qnn_name], ref, tol, qnn_name=t.qnn_name)
                for t, ref in zip(desc.outputs, outs, strict=True)
            ]
            results.append(
                GraphCheck(
                    graph=name,
                    binary=binary,
                    simulator_seconds=seconds,
                    outputs=checks,
                    passed=all(c.passed for c in checks),
                )
            )
        except Exception as exc:  # record and go on: the report must cover every graph
            log.debug("graph %s failed", graph, exc_info=True)
            results.append(GraphCheck(graph=name, binary=binary, passed=False, problem=describe_error(exc)))
    return results


@dataclass
class GraphRun:
    """One graph as the whole-model pass executed it: the plugin's inputs and outputs by QNN tensor name."""

    binary: str
    graph: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    seconds: float | None


def graph_runs(model: HybridModel, runs: Iterable[ForwardResult]) -> dict[str, GraphRun]:
    """The first execution of each graph in ``runs`` (made with ``capture=True``), by graph name."""
    found: dict[str, GraphRun] = {}
    for run in runs:
        seconds = {(t.name, t.graph): t.seconds for t in run.steps if t.kind == "qnn"}
        for step, io in run.plugin_io.items():
            graph = str(io["graph"])
            if graph not in found:
                path = model.plugins[step].spec.path
                found[graph] = GraphRun(path, graph, io["inputs"], io["outputs"], seconds.get((step, graph)))
    return found


def check_graph_runs(
    reference: SourceSubgraphRunner, ran: Iterable[GraphRun], partition_dir: Path, tol: Tolerance
) -> list[GraphCheck]:
    """(a) Each graph's simulator outputs in the whole-model pass vs its source ops on the CPU for the very inputs
    the pass fed it: the graph's own error, whatever the plugins before it did, and no simulator run of its own."""
    results = []
    for r in ran:
        try:
            graph_dir = confined(partition_dir, f"{QNN_DIR}/{r.graph}", "plugin attribute 'allGraphName'")
            desc = SubgraphRecord.read(graph_dir)
            want = reference.run(
                r.graph, [t.name for t in desc.inputs], [t.name for t in desc.outputs],
                [r.inputs[t.qnn_name] for t in desc.inputs],
            )  # fmt: skip
            reference.release(r.graph)
            checks = [
                compare(t.name, r.outputs[t.qnn_name], ref, tol, qnn_name=t.qnn_name)
                for t, ref in zip(desc.outputs, want, strict=True)
            ]
            results.append(
                GraphCheck(
                    graph=r.graph,
                    binary=r.binary,
                    fed="bundle_pass",
                    simulator_seconds=r.seconds,
                    outputs=checks,
                    passed=all(c.passed for c in checks),
                )
            )
        except Exception as exc:  # record and go on: the report must cover every graph
            log.debug("graph %s failed", r.graph, exc_info=True)
            results.append(GraphCheck(graph=r.graph, binary=r.binary, fed="bundle_pass", passed=False,
                                      problem=describe_error(exc)))  # fmt: skip
    return results


def graphs_not_run(binary: str, graphs: Sequence[str], problem: str) -> list[GraphCheck]:
    return [GraphCheck(graph=Path(g).name, binary=binary, passed=False, problem=problem) for g in graphs]


def check_graphs(
    lib: QnnLibrary, twins: Iterable[Twin], partition_dir: Path, tol: Tolerance, hashes: FileHashes | None = None
) -> list[GraphCheck]:
    """(a) for graphs no bundle pass ran (``twin.graphs``): each twin loaded on its own, its graphs run on the
    partition's reference inputs, and freed before the next (``hashes``: the twins' known hashes)."""
    results = []
    for twin in twins:
        try:
            data = twin.read(hashes)
            runner = ContextRunner(lib, data, info=read_binary_info(lib, data))
        except Exception as exc:
            results += graphs_not_run(twin.binary, twin.graphs, describe_error(exc))
            continue
        del data
        try:
            results += check_plugin_graphs(runner, twin.binary, twin.graphs, partition_dir, tol)
        finally:
            runner.close()
    return results


def plugin_checks(model: HybridModel, expected: Mapping[str, dict[str, str | None]]) -> list[PluginCheck]:
    """Check every plugin's shipped binary and its twin through the runtime (hash, binary info, target)."""
    results = []
    for runner in model.plugins.values():
        spec = runner.spec
        problem = None
        try:
            runner.check()
        except Exception as exc:
            problem = describe_error(exc)
        rep = runner.report()
        hashes = expected.get(spec.path, {})
        results.append(
            PluginCheck(
                plugin=spec.name,
                path=spec.path,
                graphs=list(spec.graph_names),
                bundle_sha256=hashes.get("bundle"),
                context_sha256=hashes.get("context"),
                shipped_sha256=rep["shipped_sha256"] or sha256_file(spec.file),
                shipped_weight_shared=rep["shipped_weight_shared"],
                target=rep["target"],
                twin_sha256=hashes.get("twin"),
                executed=rep["executed"],
                executed_source=rep["executed_source"],
                passed=problem is None,
                problem=problem,
            )
        )
    return results


@dataclass
class Sample:
    """One io sample: the whole model's inputs and the original model's outputs on the CPU."""

    seq_len: int
    feed: dict[str, np.ndarray] = field(default_factory=dict)
    refs: dict[str, np.ndarray] = field(default_factory=dict)
    problem: str | None = None
    image_size: str | None = None
    """A VL encoder's sample: its image size."""
    logits_index: int | None = None
    """A whole-block sample's ``logits_index`` (io's ``whole_block_samples``)."""


def load_samples(
    samples: list[tuple[int, Path]], image_sizes: Sequence[str | None] = (), logits_index: int | None = None
) -> list[Sample]:
    """The io stage's samples (``input.mnn``/``output.mnn`` per shape; a VL encoder's with their ``image_sizes``;
    whole-block samples with their ``logits_index``); one that cannot be read says why."""
    loaded = []
    sizes = list(image_sizes) or [None] * len(samples)
    for (seq, sample_dir), size in zip(samples, sizes, strict=True):
        try:
            loaded.append(
                Sample(
                    seq,
                    load_vars(sample_dir / REFERENCE_INPUT),
                    load_vars(sample_dir / REFERENCE_OUTPUT),
                    image_size=size,
                    logits_index=logits_index,
                )
            )
        except Exception as exc:
            log.debug("io sample %d unreadable", seq, exc_info=True)
            loaded.append(Sample(seq, problem=describe_error(exc), image_size=size, logits_index=logits_index))
    return loaded


def check_whole_model(sample: Sample, run: ForwardResult | None, tol: Tolerance) -> ShapeCheck:
    """(b) The bundle's pass on one io sample vs the original model's CPU outputs."""
    if sample.problem is not None or not sample.refs or run is None or run.error is not None:
        problem = sample.problem or ("no reference outputs" if not sample.refs else None)
        problem = problem or (describe_error(run.error) if run is not None and run.error else "not run")
        return ShapeCheck(
            seq_len=sample.seq_len,
            image_size=sample.image_size,
            logits_index=sample.logits_index,
            passed=False,
            problem=problem,
        )
    checks = []
    for name, ref in sample.refs.items():
        if name not in run.outputs:
            checks.append(
                compare(name, np.zeros(0), ref, tol).model_copy(
                    update={"problem": "the bundle does not produce this output"}
                )
            )
            continue
        checks.append(compare(name, run.outputs[name], ref, tol))
    top1 = _top1(run.outputs.get("logits"), sample.refs.get("logits"), tol)
    rows = None
    if "logits" in run.outputs and "logits" in sample.refs:
        rows = row_errors(run.outputs["logits"], sample.refs["logits"])
    return ShapeCheck(
        seq_len=sample.seq_len,
        image_size=sample.image_size,
        logits_index=sample.logits_index,
        outputs=checks,
        top1=top1,
        logits_rows=rows,
        seconds=run.mnn_seconds + run.qnn_seconds,
        mnn_seconds=run.mnn_seconds,
        qnn_seconds=run.qnn_seconds,
        passed=all(c.passed for c in checks) and (top1 is None or top1.passed),
    )


def _top1(got: np.ndarray | None, ref: np.ndarray | None, tol: Tolerance) -> Top1Check | None:
    if got is None or ref is None or got.size != ref.size:
        return None
    vocab = ref.shape[-1]
    g, r = got.reshape(-1, vocab), ref.reshape(-1, vocab)
    gi, ri = g.argmax(-1), r.argmax(-1)
    dis = [
        Top1Disagreement(
            row=int(i),
            ref_token=int(ri[i]),
            got_token=int(gi[i]),
            ref_lead=lead(r[i], int(ri[i]), int(gi[i])),
            tolerated=is_near_tie(r[i], int(ri[i]), int(gi[i]), tol),
        )
        for i in np.flatnonzero(gi != ri)
    ]
    return Top1Check(
        rows=len(r),
        agree=int((gi == ri).sum()),
        disagreements=dis,
        min_ref_margin=min(top2_margin(row) for row in r),
        passed=all(d.tolerated for d in dis),
    )


class GenerationRun:
    """(c) Greedy generation of the bundle vs MNN CPU on the original model, step by step on one sequence (each step
    at the smallest of the bundle's ``chunk_limits`` that holds it).

    The sequence is MNN's own greedy tokens: its KV-cache engine's (the draft; :mod:`mnnbuild.verify.reference`
    makes it, in a child process beside the pass for a big model). The bundle runs once per length the steps use
    (:meth:`feeds`, in the verify pass with the io samples) and the original model's recompute forward once per
    length on the same inputs: with the causal mask, row ``i`` depends only on tokens ``0..i``, so those forwards give
    both picks and both logits rows of every step, on identical prefixes. Each step compares the bundle's pick with
    the recompute forward's (a flip only on a near-tie) and the rows (the model tolerance). Where the engine's token
    is not the recompute forward's pick, MNN's two CPU arithmetics take a close call differently: recorded
    (``engine_partings``, with the engine's own row against the forward's), never a failure (the bundle is judged
    against the forward, on the engine's tokens). Where the bundle's pick leaves the sequence,
    its own tokens end (the check needs nothing more), unless ``follow_divergence``: then the bundle's own loop
    continues for real (:meth:`conclude`), from the CPU loop's guesses for its own sequence (a forward per wrong
    guess, not per token: each is a whole prefill in the simulator).
    """

    def __init__(
        self,
        model_dir: Path,
        bundle_dir: Path,
        limits: list[int],
        prompt: str,
        max_new_tokens: int,
        runtime: CpuRuntime,
        follow_divergence: bool = False,
        mask_window: int | None = None,
    ) -> None:
        """``mask_window``: the bundle's (`Bundle.mask_window`): its forwards take the engine's two-part mask."""
        self.model_dir, self.bundle_dir, self.limits, self.runtime = model_dir, bundle_dir, limits, runtime
        self.mask_window = mask_window
        self.follow = follow_divergence
        self.spec = ReferenceSpec(Path(model_dir), Path(bundle_dir), list(limits), prompt, max_new_tokens, runtime)
        self.check = GenerationCheck(prompt=prompt, max_new_tokens=max_new_tokens, passed=False)
        self.tokenizer: Tokenizer | None = None
        self.cpu_rows: list[np.ndarray] = []
        self.engine_rows: list[np.ndarray] = []
        self.embed: Embeddings | None = None
        self.shared: dict[int, int] = {}
        """By prefill length: the io sample whose bundle run is also this check's forward (:meth:`share`)."""
        self._wanted: dict[int, list[str]] = {}
        self._cpu: tuple[ForwardFn, Embeddings, Redraft] | None = None
        self.bundle_runs: dict[int, tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = {}
        """By length: the bundle pass's inputs and outputs over the sequence (its feeds and the shared samples'), for
        a speculating bundle's loop to read its rows from (`mnnbuild.verify.speculation.ReplayForward`)."""

    def reference(self) -> None:
        """The sequence and, per step, the CPU's logits row, here and now (a failure is recorded)."""
        with InProcessReference(self.spec) as job:
            self.take_draft(job.draft())
            self.take_reference(job.result(), [])

    def start(self, in_child: bool | None = None) -> ReferenceJob:
        """The CPU reference, in a child process beside the pass or here (`mnnbuild.verify.reference`)."""
        return start_reference(self.spec, in_child)

    def take_draft(self, draft: Draft) -> None:
        """The sequence to run the bundle's forwards on (a failure is recorded)."""
        self.check.prompt_ids = list(draft.prompt_ids)
        if draft.problem is not None:
            self.check.problem = draft.problem
            return
        try:
            self.tokenizer = Tokenizer(self.bundle_dir / CONFIG_FILE)
            self.embed = Embeddings(self.bundle_dir)  # the bundle's own embeddings, as the phone reads them
        except Exception as exc:
            log.debug("generation reference failed", exc_info=True)
            self.check.problem = describe_error(exc)
            return
        self.check.cpu_tokens = list(draft.tokens)
        self.check.sequence = "engine" if draft.from_engine else "recompute"

    def take_reference(self, ref: Reference, samples: list[Sample]) -> None:
        """The CPU's rows on the sequence, and the shared io samples' reference outputs (into ``samples``)."""
        check = self.check
        for size, i in self.shared.items():
            sample, outputs = samples[i], ref.outputs.get(size, {})
            missing = [k for k in self._wanted[size] if k not in outputs]
            if ref.problem is not None or missing:
                why = ref.problem or f"the original model gives no {missing}"
                samples[i] = dataclasses.replace(sample, refs={}, problem=f"its CPU reference failed: {why}")
            else:
                samples[i] = dataclasses.replace(sample, refs={k: outputs[k] for k in self._wanted[size]})
        check.cpu_seconds = ref.seconds.get("draft", 0.0) + ref.seconds.get("confirm", 0.0)
        if ref.problem is not None:
            check.problem = check.problem or ref.problem
            self.shared = {}
            check.shared_lengths = []
            return
        self.cpu_rows, self.engine_rows = ref.rows, ref.engine_rows

    def _feeds(
        self, tokens: list[int], pads: Mapping[int, np.ndarray] | None = None
    ) -> dict[int, dict[str, np.ndarray]]:
        if self.check.problem is not None or self.embed is None:
            return {}
        feeds = draft_feeds(self.embed, self.check.prompt_ids, tokens, len(tokens), self.limits, pads)
        # the mask as the engine builds it, as the io samples carry it (so that share() finds them)
        return {size: text_feeds(feed, {}, self.mask_window) for size, feed in feeds.items()}

    def feeds(self) -> dict[int, dict[str, np.ndarray]]:
        """The bundle's inputs for the prompt and the sequence, one per length the steps use and no io sample serves
        (:meth:`share`); none when the reference failed."""
        return {size: feed for size, feed in self._feeds(self.check.cpu_tokens).items() if size not in self.shared}

    def share(self, samples: list[Sample]) -> dict[int, dict[str, np.ndarray]]:
        """Let the whole-model check's bundle runs serve this check's forwards: one simulator prefill fewer per
        length (at real size, minutes). An io sample of such a length with the same other inputs (a text LLM's
        causal mask, positions, ``logits_index`` 0) takes the prompt and the sequence in its first rows and keeps its
        own random rows after them, which the causal mask keeps out of the generation's rows; its reference outputs
        are then the original model's on the CPU for exactly those inputs, which the CPU reference computes: returns
        those inputs by length (their outputs come with :meth:`take_reference`)."""
        matches: dict[int, int] = {}
        for size, feed in self._feeds(self.check.cpu_tokens).items():
            for i, sample in enumerate(samples):
                same = (
                    sample.problem is None
                    and sample.image_size is None
                    and sample.seq_len == size
                    and set(sample.feed) == set(feed)
                    and np.shape(sample.feed["input_ids"]) == feed["input_ids"].shape
                    and all(np.array_equal(sample.feed[k], v) for k, v in feed.items() if k != "input_ids")
                )
                if same:
                    matches[size] = i
                    break
        pads = {size: samples[i].feed["input_ids"] for size, i in matches.items()}
        shared = {}
        for size, feed in self._feeds(self.check.cpu_tokens, pads).items():
            if size not in matches:
                continue
            sample = samples[matches[size]]
            self._wanted[size] = list(sample.refs)
            samples[matches[size]] = Sample(sample.seq_len, feed, {})  # its reference outputs: take_reference's
            self.shared[size] = matches[size]
            shared[size] = feed
        self.check.shared_lengths = sorted(self.shared)
        return shared

    def _cpu_loop(self) -> tuple[ForwardFn, Embeddings, Redraft]:
        """The original model's forward, embeddings and KV-cache guess here (a followed divergence only)."""
        if self._cpu is None:
            self._cpu = (cpu_forward_fn(self.model_dir, self.runtime), Embeddings(self.model_dir, links=True),
                         kv_cache_redraft(self.model_dir, self.runtime))  # fmt: skip
        return self._cpu

    def plain_greedy(self) -> GenerationResult | None:
        """The original model's plain greedy loop on the CPU, when the sequence is its tokens (every recompute pick is
        the sequence's token): the rows the reference computed are that loop's rows, bit for bit. None otherwise."""
        check, rows = self.check, self.cpu_rows
        if check.problem is not None or not check.cpu_tokens or len(rows) != len(check.cpu_tokens):
            return None
        if any(int(row.argmax()) != token for row, token in zip(rows, check.cpu_tokens, strict=True)):
            return None
        return GenerationResult(list(check.prompt_ids), list(check.cpu_tokens), "max_new_tokens", max(self.limits),
                                top2_margins=[top2_margin(r) for r in rows], rows=list(rows))  # fmt: skip

    def _partings(self, tol: Tolerance) -> list[EngineParting]:
        """The steps whose sequence token (MNN's KV-cache engine's) is not the recompute forward's pick, with the
        engine's own row there against the forward's."""
        found = []
        for i, (token, row) in enumerate(zip(self.check.cpu_tokens, self.cpu_rows, strict=True)):
            pick = int(row.argmax())
            if pick == token:
                continue
            parting = EngineParting(step=i, engine_token=token, recompute_token=pick, lead=lead(row, pick, token),
                                    near_tie=is_near_tie(row, pick, token, tol))  # fmt: skip
            if i < len(self.engine_rows):
                engine = compare(f"step {i} engine logits", self.engine_rows[i], row, tol)
                parting.engine_rel_err, parting.engine_cosine = engine.rel_err, engine.cosine
            found.append(parting)
        return found

    def conclude(
        self,
        forward: ForwardFn,
        runs: Mapping[int, ForwardResult],
        tol: Tolerance,
        release: Callable[[], None] | None = None,
    ) -> GenerationCheck:
        """Judge the bundle's passes over the sequence (``runs``, by length: of :meth:`feeds` and the shared samples)
        against the CPU's rows on it; ``forward`` continues the bundle's loop after a divergence when it is followed,
        and ``release`` (the bundle's unload) runs before each CPU guess, so a plugin context (an lm_head's is over
        1 GB) and the CPU's decoded weights are never in memory together."""
        check = self.check
        if check.problem is not None:
            return check
        try:
            failed = [r.error for r in runs.values() if r.error is not None]
            if failed:
                raise failed[0]
            if not check.cpu_tokens:
                raise ToleranceError("the CPU reference gave no tokens: nothing to compare")
            if len(self.cpu_rows) != len(check.cpu_tokens):
                raise ToleranceError(f"the CPU reference gave {len(self.cpu_rows)} rows for {len(check.cpu_tokens)} "
                                     "tokens")  # fmt: skip
            assert self.tokenizer is not None and self.embed is not None
            ids, seq, cpu_rows = check.prompt_ids, check.cpu_tokens, self.cpu_rows
            t0 = time.perf_counter()
            logits = {size: run.outputs["logits"] for size, run in runs.items()}
            hyb_rows = draft_rows(logits, ids, seq, self.limits)

            # after a divergence the bundle's own loop goes on, from MNN's guesses for its sequence
            # (each guess: the CPU's own loop from the bundle's sequence; they part only on near-ties)
            def guess(prefix: list[int], n: int) -> Sequence[int]:
                if release is not None:
                    release()
                cpu_forward, cpu_embed, cpu_guess = self._cpu_loop()
                return loop_redraft(cpu_forward, cpu_embed, self.limits, cpu_guess)(prefix, n)

            # the bundle's own tokens: the sequence's while its picks keep it (no forward: the runs hold every row)
            hyb = follow_draft(forward, self.embed, ids, seq, len(seq), self.limits, logits=logits, redraft=guess,
                               follow=self.follow)  # fmt: skip
            check.engine_partings = self._partings(tol)  # recorded: the steps are judged against the forward
            ok = True
            for i, (hyb_row, cpu_row) in enumerate(zip(hyb_rows, cpu_rows, strict=True)):
                step = generation_step(i, hyb_row, cpu_row, int(cpu_row.argmax()), int(hyb_row.argmax()), tol)
                check.steps.append(step)
                ok = ok and step_passed(step)
            first = hyb.rejected
            check.hybrid_tokens = list(hyb.result.tokens)
            check.followed = first is not None and self.follow
            if first is not None:
                check.divergence_note = _divergence_note(check.steps[first], seq[first])
            check.first_divergence = first
            passes = sum(run.mnn_seconds + run.qnn_seconds for run in runs.values())
            check.hybrid_seconds = passes + time.perf_counter() - t0
            check.hybrid_forwards = len(runs) + hyb.forwards
            check.cpu_text = _decode(self.tokenizer, check.cpu_tokens)
            check.hybrid_text = _decode(self.tokenizer, check.hybrid_tokens)
            check.passed = ok
        except Exception as exc:
            log.debug("generation failed", exc_info=True)
            check.problem = describe_error(exc)
            check.passed = False
        return check


def generation_step(
    i: int, got_row: np.ndarray, cpu_row: np.ndarray, token: int, pick: int, tol: Tolerance
) -> GenerationStep:
    """Step ``i`` of a generation, both rows on the same prefix: the CPU's ``token`` and the bundle's ``pick``, a flip
    tolerated only on a near-tie of the CPU's row, the rows within the model tolerance."""
    flip = pick != token
    return GenerationStep(
        step=i,
        cpu_token=token,
        hybrid_pick=pick,
        cpu_margin=top2_margin(cpu_row),
        logits=compare(f"step {i} logits", got_row, cpu_row, tol),
        tolerated_flip=flip and is_near_tie(cpu_row, token, pick, tol),
        cpu_lead=lead(cpu_row, token, pick) if flip else None,
    )


def step_passed(step: GenerationStep) -> bool:
    return step.logits.passed and (step.hybrid_pick == step.cpu_token or step.tolerated_flip)


def _divergence_note(s: GenerationStep, engine_token: int) -> str:
    """Why the bundle's pick at step ``s`` leaves the sequence, whose token there is ``engine_token``."""
    if s.hybrid_pick == s.cpu_token:  # the bundle agrees with the CPU's forward; MNN's engine went the other way
        return (f"engine {engine_token}, hybrid {s.hybrid_pick}: the bundle picks what the CPU's recompute forward "
                "picks; MNN's KV-cache engine parts from both (see the engine partings)")  # fmt: skip
    tie = "a near-tie, tolerated" if s.tolerated_flip else "NOT a near-tie"
    note = (f"cpu {s.cpu_token}, hybrid {s.hybrid_pick}; the CPU prefers {s.cpu_token} by {s.cpu_lead:.4g} (top-2 "
            f"margin {s.cpu_margin:.4g}, {tie})")  # fmt: skip
    return note if engine_token == s.cpu_token else f"{note}; MNN's KV-cache engine picks {engine_token}"


def _decode(tokenizer: Tokenizer, ids: list[int]) -> str:
    """Text for the report only: a byte-level BPE token may be part of a UTF-8 character, which MNN's
    binding fails to turn into a str; such tokens show as U+FFFD."""
    parts = []
    for t in ids:
        try:
            parts.append(tokenizer.decode([t]))
        except UnicodeDecodeError:
            parts.append("\ufffd")
    return "".join(parts)
