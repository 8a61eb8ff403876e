"""Running verify's checks on a bundle (`run_checks`): the integrity and plugin checks, then one simulator pass
that serves the per-graph, whole-model, generation and speculation checks, and the report they fill
(`mnnbuild.stages.verify` is the stage: it writes the report and decides the manifest)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mnnbuild_runtime import Bundle, FileHashes, HybridModel
from mnnbuild_runtime.bundle import CONFIG_FILE
from mnnbuild_runtime.tokenizer import Tokenizer

from mnnbuild.base.errors import MnnbuildError, StageError
from mnnbuild.base.logs import progress
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest, read_merge
from mnnbuild.manifests.plugin import plugin_sources
from mnnbuild.manifests.verify import VerifyInputs, VerifyParams
from mnnbuild.model.modeldir import DEFAULT_PROMPT, chain_part
from mnnbuild.partition.reference import SourceSubgraphRunner
from mnnbuild.pipeline.layout import PROMPT_FILE, QNN_DIR, bundle_model_dir
from mnnbuild.pipeline.origin import trusted_hashes
from mnnbuild.qnn import HtpTarget, QnnLibrary
from mnnbuild.samples.inputs import LAST_ROW
from mnnbuild.verify import checks, failures, speculation
from mnnbuild.verify.reference import ReferenceJob
from mnnbuild.verify.verdict import GraphCheck, SpeculationCheck, VerifyReport, finish_timings

log = logging.getLogger(__name__)


def _expected_hashes(
    bundle: BundleManifest, model_prefix: str, contexts: dict[str, ContextManifest], twins: dict[str, checks.Twin]
) -> dict[str, dict[str, str]]:
    """Per plugin path: the shipped binary's hash in the bundle manifest and in its context manifest, and the
    twin's."""
    hashes: dict[str, dict[str, str]] = {}
    for rec in bundle.outputs:
        if rec.path.startswith(model_prefix + "qnn/") and rec.path.endswith(".bin"):
            hashes.setdefault(rec.path[len(model_prefix) :], {})["bundle"] = rec.sha256
    for binary, ctx in contexts.items():
        hashes.setdefault(binary, {})["context"] = ctx.output(ctx.binary).sha256
    for binary, twin in twins.items():
        hashes.setdefault(binary, {})["twin"] = twin.sha256
    return hashes


def _context_problems(
    inputs: VerifyInputs,
    part: Part,
    params: VerifyParams,
    merge: dict[str, list[str]],
    contexts: dict[str, ContextManifest],
    twins: dict[str, checks.Twin],
) -> list[str]:
    """The twins stand in for the shipped binaries only if the context and twin stages built both from the same
    partition graphs and weights (by hash) for the same SoC; manifests only, nothing is re-hashed."""
    fetch = inputs.manifest(FetchManifest, Path(inputs.model_dir))
    partition = inputs.manifest(PartitionManifest, part.partition_dir)
    problems = []
    for binary, graphs in merge.items():
        expected = set(plugin_sources(fetch, partition, graphs))
        ctx, twin = contexts.get(binary), twins.get(binary)
        built = [("context stage", ctx.inputs, ctx.params.soc)] if ctx else []
        built += [("twin stage", twin.manifest.inputs, twin.manifest.params.soc)] if twin else []
        for stage, used, soc in built:
            if set(used) != expected:
                problems.append(
                    f"plugin {binary}: the {stage} built it from other graphs or weights than the current "
                    f"{part.partition_dir} and {inputs.model_dir} ({len(set(used) ^ expected)} files differ); the "
                    "twin would not stand in for it"
                )
            if soc != params.soc:
                problems.append(f"plugin {binary}: the {stage} built it for {soc.name}, verifying {params.soc.name}")
    return problems


def _read_prompt(model_dir: Path, prompt: str | None) -> str:
    if prompt is not None:
        return prompt
    try:
        text = (model_dir / PROMPT_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    return text or DEFAULT_PROMPT.strip()


@dataclass(frozen=True)
class Part:
    """One model file of the bundle, checked on its own: the language model, or a VL model's encoder."""

    partition_dir: Path
    io_dir: Path
    visual: bool = False


def parts(inputs: VerifyInputs) -> list[Part]:
    parts = [Part(Path(inputs.partition_dir), Path(inputs.io_dir))]
    if inputs.visual_partition_dir is not None:
        if inputs.visual_io_dir is None:
            raise StageError(f"verify {inputs.model}: a visual partition needs the visual io dir too")
        parts.append(Part(Path(inputs.visual_partition_dir), Path(inputs.visual_io_dir), True))
    return parts


def _add(timings: dict[str, float], key: str, since: float) -> float:
    """Add the seconds since ``since`` to ``timings[key]``; returns now."""
    now = time.perf_counter()
    timings[key] = timings.get(key, 0.0) + now - since
    return now


def _run_bundle(
    model: HybridModel,
    inputs: VerifyInputs,
    part: Part,
    params: VerifyParams,
    twins: dict[str, checks.Twin],
    report: VerifyReport,
    timings: dict[str, float],
    gen: checks.GenerationRun | None,
    job: ReferenceJob | None,
) -> dict[str, list[GraphCheck]]:
    """The whole model and (language model) generation checks in one pass of the bundle over every input (io
    samples and the generation sequence), ``params.max_loaded_plugins`` plugin contexts loaded at a time; then
    the per-graph checks of every graph the pass ran, on the CPU. Returns them by plugin path.

    ``job``: the generation's CPU reference (`mnnbuild.verify.reference`); the pass needs only its draft (the
    sequence the generation runs on), and the rest of it is awaited after the per-graph checks (for a big model it
    runs beside the pass and them)."""
    t0 = time.perf_counter()
    io = IoManifest.read(part.io_dir)
    samples = checks.load_samples(
        [(s.seq_len, d) for s, d in zip(io.samples, io.sample_dirs(part.io_dir), strict=True)],
        [s.image_size for s in io.samples],
    )
    # the engine's whole prefill blocks (logits_index -1): no graph of their own, each plugin must find one
    whole_blocks = checks.load_samples(
        [(s.seq_len, d) for s, d in zip(io.whole_block_samples, io.whole_block_dirs(part.io_dir), strict=True)],
        logits_index=LAST_ROW,
    )
    first_whole_block = len(samples)
    samples += whole_blocks
    t0 = _add(timings, "samples", t0)
    if gen is not None and job is not None:
        gen.take_draft(job.draft())
        t0 = _add(timings, "reference_wait", t0)
        job.send_shared(gen.share(samples))
    done = [i for i, s in enumerate(samples) if s.problem is None]  # runs[k] is samples[done[k]]'s
    feeds = [samples[i].feed for i in done]
    gen_feeds = gen.feeds() if gen is not None else {}
    # captured: each plugin's inputs and outputs serve its per-graph check (no simulator run of its own)
    passes, what = len(feeds) + len(gen_feeds), "visual encoder" if part.visual else "model"
    loads = sum(r.load_seconds for r in model.plugins.values())
    t0 = time.perf_counter()
    with progress(desc=f"verify: {passes} passes of the {what}", total=model.step_count, unit="step") as bar:

        def stepped(name: str) -> None:
            bar.set_postfix_str(name, refresh=False)
            bar.update()

        runs = model.run_many([*feeds, *gen_feeds.values()], capture=True, on_step=stepped)
    _add(timings, "bundle_pass", t0)
    timings["loads"] = timings.get("loads", 0.0) + sum(r.load_seconds for r in model.plugins.values()) - loads
    timings["simulator"] = timings.get("simulator", 0.0) + sum(r.qnn_seconds for r in runs)
    timings["cpu_segments"] = timings.get("cpu_segments", 0.0) + sum(r.mnn_seconds for r in runs)
    # what the whole-block samples added to the pass (a plugin fed the bytes it already ran on costs nothing)
    extra = [r for i, r in zip(done, runs, strict=False) if i >= first_whole_block]
    timings["whole_blocks"] = timings.get("whole_blocks", 0.0) + sum(r.qnn_seconds + r.mnn_seconds for r in extra)
    ran = {g: r for g, r in checks.graph_runs(model, runs).items() if r.binary in twins}
    for run in runs:
        run.plugin_io.clear()  # the graph runs hold what the checks need

    t0 = time.perf_counter()
    model.unload()  # the graphs' CPU ops take the memory now (an lm_head is 1.2 GB in float32)
    fetched = inputs.manifest(FetchManifest, Path(inputs.model_dir)).part
    source = chain_part(fetched, inputs.manifest(PartitionManifest, part.partition_dir).params.part)
    model_dir = Path(inputs.model_dir)
    with SourceSubgraphRunner(
        model_dir / source.model_file, model_dir / source.weight_file, part.partition_dir / QNN_DIR, params.runtime
    ) as reference:
        desc = f"verify: graphs of the {what} on the CPU"
        graph_runs = progress(ran.values(), desc=desc, total=len(ran), unit="graph")
        found = checks.check_graph_runs(reference, graph_runs, part.partition_dir, params.graph_tolerance)
    t0 = _add(timings, "graphs", t0)

    if gen is not None and job is not None:
        ref = job.result()
        t0 = _add(timings, "reference_wait", t0)
        gen.take_reference(ref, samples)
        for k, v in ref.seconds.items():
            timings[f"cpu_reference_{k}"] = timings.get(f"cpu_reference_{k}", 0.0) + v
        timings["cpu_reference"] = timings.get("cpu_reference", 0.0) + sum(ref.seconds.values())
    by_sample = dict(zip(done, runs, strict=False))
    report.whole_model += [
        checks.check_whole_model(s, by_sample.get(i), params.model_tolerance) for i, s in enumerate(samples)
    ]
    t0 = _add(timings, "comparison", t0)
    if gen is not None:
        gen_runs = dict(zip(gen_feeds, runs[len(feeds) :], strict=True))
        gen_runs |= {size: by_sample[i] for size, i in gen.shared.items()}
        fed = gen_feeds | {size: samples[i].feed for size, i in gen.shared.items()}
        gen.bundle_runs = {size: (fed[size], run.outputs) for size, run in gen_runs.items() if run.error is None}
        with progress(desc="verify: generation", unit="step") as bar:

            def forward(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                bar.update()
                return model.forward(feed)

            report.generation = gen.conclude(forward, gen_runs, params.model_tolerance, release=model.unload)
        _add(timings, "generation", t0)
    graphs: dict[str, list[GraphCheck]] = {}
    for g in found:
        graphs.setdefault(g.binary, []).append(g)
    return graphs


def _check_speculation(
    model: HybridModel,
    inputs: VerifyInputs,
    params: VerifyParams,
    gen: checks.GenerationRun,
    contexts: dict[str, ContextManifest],
) -> SpeculationCheck | None:
    """A speculating bundle's tree-shaped sample and speculative generation (`mnnbuild.verify.speculation`), on the
    generation check's prompt; None for a bundle that does not speculate."""
    prompt_ids = gen.check.prompt_ids
    if not prompt_ids:
        prompt_ids = Tokenizer(model.bundle.model_dir / CONFIG_FILE).encode(gen.check.prompt)
    return speculation.check_speculation(
        model,
        Path(inputs.model_dir),
        prompt_ids,
        params.max_new_tokens,
        params.runtime,
        params.model_tolerance,
        speculation.npu_weight_bytes(contexts),
        replay=gen.bundle_runs,
        plain=gen.plain_greedy(),
        follow=params.follow_divergence,
    )


def _check_part(
    inputs: VerifyInputs,
    params: VerifyParams,
    part: Part,
    bundle: BundleManifest,
    lib: QnnLibrary,
    target: HtpTarget,
    report: VerifyReport,
    timings: dict[str, float],
    hashes: FileHashes,
) -> list[failures.Failure]:
    """Plugins, per-graph and whole-model checks of one part (and generation, for the language model); adds them
    to ``report`` and returns the failures found. The language model's CPU reference starts first: for a big model
    it runs beside everything up to the whole-model comparison (`mnnbuild.verify.reference`)."""
    model_prefix = f"model/{bundle.model_name}/"
    bundle_model = bundle_model_dir(inputs.bundle_dir, bundle.model_name)
    found: list[failures.Failure] = []
    merge = read_merge(part.partition_dir)
    t0 = time.perf_counter()
    opened = None
    try:
        opened = Bundle.open(bundle_model, visual=part.visual)
    except MnnbuildError as exc:
        found.append(failures.structure(f"bundle {bundle_model}: {exc}"))
    t0 = _add(timings, "open", t0)
    gen, job = None, None
    if opened is not None and not part.visual and inputs.manifest(FetchManifest, Path(inputs.model_dir)).part.generates:
        gen = checks.GenerationRun(
            Path(inputs.model_dir),
            opened.model_dir,
            opened.block_sizes,
            _read_prompt(opened.model_dir, params.prompt),
            params.max_new_tokens,
            params.runtime,
            params.follow_divergence,
            opened.mask_window,
        )
        job = gen.start()
    with job if job is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        contexts, problems = checks.read_contexts(Path(inputs.context_dir), merge)
        twins, twin_problems = checks.read_twins(Path(inputs.twin_dir), contexts, merge)
        for path, known in checks.twin_hashes(twins.values(), Path(inputs.twin_dir)).items():
            hashes.add(path, known)
        found += [failures.structure(p) for p in problems + twin_problems]
        found += [failures.structure(p) for p in _context_problems(inputs, part, params, merge, contexts, twins)]
        t0 = _add(timings, "twins", t0)

        expected = _expected_hashes(bundle, model_prefix, contexts, twins)
        graphs: dict[str, list[GraphCheck]] = {}
        model = None
        try:
            if opened is not None:
                model = HybridModel(
                    opened,
                    binary_overrides={path: twin.override() for path, twin in twins.items()},
                    expected_target=target,
                    qnn_lib=lib,
                    runtime=params.runtime,
                    max_loaded=params.max_loaded_plugins,
                    hashes=hashes,
                )
        except MnnbuildError as exc:
            found.append(failures.structure(f"bundle {bundle_model}: {exc}"))
        t0 = _add(timings, "open", t0)
        try:
            if model is not None:
                plugins = checks.plugin_checks(model, expected)
                report.plugins += plugins
                found += failures.plugin_failures(plugins)
                _add(timings, "plugin_checks", t0)
                if twins and all(p.passed for p in plugins):
                    graphs = _run_bundle(model, inputs, part, params, twins, report, timings, gen, job)
                    if gen is not None:
                        t0 = time.perf_counter()
                        report.speculation = _check_speculation(model, inputs, params, gen, contexts)
                        if report.speculation is not None:  # a plain bundle's report stays as it was
                            _add(timings, "speculation", t0)
                else:
                    found.append(
                        failures.structure(
                            "whole model and generation not run: a plugin binary failed its checks", -1.0
                        )
                    )
                for p, runner in zip(plugins, model.plugins.values(), strict=True):
                    rep = runner.report()
                    p.load_seconds, p.loads, p.simulator_seconds = (
                        rep["load_seconds"],
                        rep["loads"],
                        rep["simulator_seconds"],
                    )
        finally:
            if model is not None:
                model.close()
    # the graphs the pass did not run: each twin on its own (they do not depend on the bundle)
    t0 = time.perf_counter()
    checked = {g.graph for found_graphs in graphs.values() for g in found_graphs}
    missing = [
        dataclasses.replace(t, graphs=[g for g in t.graphs if Path(g).name not in checked]) for t in twins.values()
    ]
    rest = checks.check_graphs(
        lib, [t for t in missing if t.graphs], part.partition_dir, params.graph_tolerance, hashes
    )
    _add(timings, "graphs", t0)
    for g in rest:
        graphs.setdefault(g.binary, []).append(g)
    for binary, graph_dirs in merge.items():
        if binary not in twins:  # why is among the context problems
            graphs[binary] = checks.graphs_not_run(binary, graph_dirs, "no unshared twin: see the plugin's problems")
    part_graphs = [g for binary in merge for g in graphs.get(binary, [])]
    report.graphs += part_graphs
    found += failures.graph_failures(part_graphs, params.graph_tolerance)
    return found


def run_checks(inputs: VerifyInputs, params: VerifyParams, out_dir: Path) -> VerifyReport:
    """Every check, in order; returns the report (never raises for a failed check). It names the bundle relative
    to ``out_dir`` (where the report goes), so a report restored from the cache into another artifact root names
    that root's bundle. Its ``timings`` say where each second went (`mnnbuild.verify.verdict.TIMINGS`)."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    bundle = BundleManifest.read(inputs.bundle_dir)
    bundle_model = bundle_model_dir(inputs.bundle_dir, bundle.model_name)
    soc = params.soc
    report = VerifyReport(
        model=inputs.model,
        target=soc.dsp_arch,
        soc=soc.name,
        bundle=os.path.relpath(os.path.abspath(bundle_model), os.path.abspath(out_dir)),
        passed=False,
        graph_tolerance=params.graph_tolerance,
        model_tolerance=params.model_tolerance,
        executed_note="",
    )
    t0 = time.perf_counter()
    # the files the bundle stage hashed, unchanged since (their stamps), are not hashed again; nor, by the runtime,
    # what integrity found unchanged
    trusted = trusted_hashes(Path(inputs.bundle_dir), BundleManifest.stage)
    report.integrity, known = checks.integrity_hashes(Path(inputs.bundle_dir), bundle.outputs, trusted)
    hashes = FileHashes(known)
    found = [failures.Failure(failures.INTEGRITY, 0.0, p) for p in report.integrity.problems]
    t0 = _add(timings, "integrity", t0)

    lib = QnnLibrary()
    _add(timings, "qnn_library", t0)
    report.qnn = {k: str(v) for k, v in lib.version.as_dict().items() if k != "lib_dir"}
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    for part in parts(inputs):
        found += _check_part(inputs, params, part, bundle, lib, target, report, timings, hashes)
    t0 = time.perf_counter()
    found += failures.whole_model_failures(report.whole_model, params.model_tolerance)
    found += failures.generation_failures(report.generation, params.model_tolerance)
    found += failures.speculation_failures(report.speculation, params.model_tolerance)
    report.executed_note = failures.executed_note(report.plugins)
    failures.conclude(report, found)
    _add(timings, "comparison", t0)
    timings["hashing"] = report.integrity.hash_seconds + hashes.seconds
    report.binaries_hashed, report.binaries_trusted = hashes.hashed, hashes.trusted
    timings["total"] = time.perf_counter() - started
    report.timings = finish_timings(timings)
    return report
