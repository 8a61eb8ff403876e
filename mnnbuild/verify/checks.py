"""The checks of the verify stage. Each returns report records and never raises on a failed check:
a check that cannot run records why, so the report is always complete.

The x86 HTP library cannot load weight-shared context binaries (``mnnbuild/qnn/README.md``), so the
numbers come from *unshared twins*: the same modellib graphs composed again with weight sharing off
(:func:`build_twins`). The shipped binaries are tied to those materials by hash (context manifest =
bundle manifest = file) and by structure (binary info checked against the plugin attributes by the
runtime's ``check_structure``, for the shipped binary and the twin alike).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mnnbuild_runtime import (
    Embeddings,
    HybridModel,
    Tokenizer,
    cpu_forward_fn,
    cpu_greedy_generate,
    fit_block,
    llm_inputs,
    recompute_generate,
)
from tqdm import tqdm

from mnnbuild.compare import Tolerance, compare
from mnnbuild.cpu import CpuRuntime, load_vars
from mnnbuild.errors import MnnbuildError, StageError, UnsafePathError
from mnnbuild.fsutil import confined, sha256_bytes, sha256_file
from mnnbuild.layout import CONFIG_FILE, REFERENCE_INPUT, REFERENCE_OUTPUT, manifest_file, origin_file
from mnnbuild.lowering.graph import compose_context, read_graph_dirs
from mnnbuild.manifest import FileRecord
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.qnn import ContextRunner, HtpTarget, QnnLibrary, read_binary_info
from mnnbuild.verify.compare import is_near_tie, lead, row_errors, top2_margin
from mnnbuild.verify.report import (
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


def _problem(exc: BaseException) -> str:
    # MNN raises bare RuntimeError/SystemError; keep the type so a bug is not mistaken for a bad bundle
    return str(exc) if isinstance(exc, MnnbuildError) else f"{type(exc).__name__}: {exc}"


def check_integrity(bundle_dir: Path, records: list[FileRecord]) -> IntegrityCheck:
    """Every file the bundle manifest lists must be there with its size and sha256; nothing else may be."""
    problems = []
    listed = set()
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
        digest = sha256_file(path)
        if size != rec.size or digest != rec.sha256:
            problems.append(
                f"bundle file {rec.path}: sha256 {digest[:12]}… ({size} bytes) differs from the bundle manifest's "
                f"{rec.sha256[:12]}… ({rec.size} bytes): changed after bundling"
            )
    extra = sorted(
        p.relative_to(bundle_dir).as_posix()
        for p in bundle_dir.rglob("*")
        if p.is_file() and p.name not in _BOOKKEEPING and p.relative_to(bundle_dir).as_posix() not in listed
    )
    problems += [f"bundle file {e}: not listed in the bundle manifest" for e in extra]
    return IntegrityCheck(files=len(records), problems=problems, passed=not problems)


@dataclass
class Twin:
    binary: str
    graphs: list[str]
    data: bytes
    sha256: str
    seconds: float


def build_twins(
    lib: QnnLibrary, target: HtpTarget, modellib_dir: Path, merge: Mapping[str, list[str]]
) -> dict[str, Twin]:
    """An unshared context binary per plugin, from the same modellib graphs the shipped one was built from."""
    twins = {}
    for binary, graphs in tqdm(merge.items(), desc="unshared twins", unit="binary", leave=False, disable=None):
        t0 = time.perf_counter()
        data = compose_context(lib, target, read_graph_dirs(modellib_dir, graphs), weight_sharing=False)
        twins[binary] = Twin(binary, list(graphs), data, sha256_bytes(data), time.perf_counter() - t0)
        log.info(
            "verify: twin %s (%s): %.1f MB in %.2fs", binary, ", ".join(graphs), len(data) / 1e6, twins[binary].seconds
        )
    return twins


def check_graphs(lib: QnnLibrary, twins: Mapping[str, Twin], partition_dir: Path, tol: Tolerance) -> list[GraphCheck]:
    """(a) Every graph in the simulator (its twin) on the partition's reference inputs vs its reference outputs."""
    results = []
    todo = [(t, g) for t in twins.values() for g in t.graphs]
    runners: dict[str, ContextRunner] = {}
    try:
        for twin, graph in tqdm(todo, desc="graphs", unit="graph", leave=False, disable=None):
            name = Path(graph).name
            try:
                runner = runners.get(twin.binary)
                if runner is None:
                    runner = runners[twin.binary] = ContextRunner(lib, twin.data, info=read_binary_info(lib, twin.data))
                graph_dir = partition_dir / graph
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
                        binary=twin.binary,
                        simulator_seconds=seconds,
                        outputs=checks,
                        passed=all(c.passed for c in checks),
                    )
                )
            except Exception as exc:  # record and go on: the report must cover every graph
                log.debug("graph %s failed", graph, exc_info=True)
                results.append(GraphCheck(graph=name, binary=twin.binary, passed=False, problem=_problem(exc)))
    finally:
        for r in runners.values():
            r.close()
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
            problem = _problem(exc)
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


def check_whole_model(model: HybridModel, samples: list[tuple[int, Path]], tol: Tolerance) -> list[ShapeCheck]:
    """(b) The bundle on each io sample vs the original model's CPU outputs (the io stage's output.mnn)."""
    results = []
    for seq, sample_dir in samples:
        try:
            feed = load_vars(sample_dir / REFERENCE_INPUT)
            refs = load_vars(sample_dir / REFERENCE_OUTPUT)
            t0 = time.perf_counter()
            run = model.run(feed)
            seconds = time.perf_counter() - t0
            checks = []
            for name, ref in refs.items():
                if name not in run.outputs:
                    checks.append(
                        compare(name, np.zeros(0), ref, tol).model_copy(
                            update={"problem": "the bundle does not produce this output"}
                        )
                    )
                    continue
                checks.append(compare(name, run.outputs[name], ref, tol))
            top1 = _top1(run.outputs.get("logits"), refs.get("logits"), tol)
            rows = None
            if "logits" in run.outputs and "logits" in refs:
                rows = row_errors(run.outputs["logits"], refs["logits"])
            results.append(
                ShapeCheck(
                    seq_len=seq,
                    outputs=checks,
                    top1=top1,
                    logits_rows=rows,
                    seconds=seconds,
                    mnn_seconds=run.mnn_seconds,
                    qnn_seconds=run.qnn_seconds,
                    passed=all(c.passed for c in checks) and (top1 is None or top1.passed),
                )
            )
        except Exception as exc:
            log.debug("whole model seq %d failed", seq, exc_info=True)
            results.append(ShapeCheck(seq_len=seq, passed=False, problem=_problem(exc)))
    return results


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


def check_generation(
    model: HybridModel,
    model_dir: Path,
    prompt: str,
    max_new_tokens: int,
    tol: Tolerance,
    runtime: CpuRuntime,
) -> GenerationCheck:
    """(c) Greedy tokens of the bundle vs MNN CPU on the original model (same recompute loop, each step at the
    smallest of the bundle's ``chunk_limits`` that holds the sequence).

    The CPU runs the loop step by step. The bundle is then run once per length the loop used, on the CPU's
    sequence: with the causal mask, row ``i`` depends only on tokens ``0..i``, so that forward gives the bundle's
    greedy pick for every CPU prefix run at that length and its logits to compare. Where the picks all agree,
    the bundle's greedy tokens *are* the CPU's; from a first divergence on, the bundle's own loop continues.
    """
    check = GenerationCheck(prompt=prompt, max_new_tokens=max_new_tokens, passed=False)
    try:
        tokenizer = Tokenizer(model.bundle.model_dir / CONFIG_FILE)
        ids = tokenizer.encode(prompt)
        limits, chunk = model.bundle.block_sizes, model.bundle.chunk_size
        steps = min(max_new_tokens, chunk - len(ids))
        check.prompt_ids = ids
        if steps <= 0:
            raise StageError(f"prompt {prompt!r} has {len(ids)} tokens; no room left in the chunk of {chunk}")
        t0 = time.perf_counter()
        cpu = cpu_greedy_generate(model_dir, ids, steps, chunk=limits, runtime=runtime)
        seq = ids + cpu.tokens
        cpu_rows, _ = _step_rows(cpu_forward_fn(model_dir, runtime), Embeddings(model_dir), seq, len(ids), limits)
        check.cpu_seconds = time.perf_counter() - t0
        check.cpu_tokens = list(cpu.tokens)
        t0 = time.perf_counter()
        hyb_embed = Embeddings(model.bundle.model_dir)  # the bundle's own embeddings, as the phone reads them
        hyb_rows, forwards = _step_rows(model.forward, hyb_embed, seq, len(ids), limits)
        first = None
        ok = True
        for i, token in enumerate(cpu.tokens):
            r = i
            pick = int(hyb_rows[r].argmax())
            flip = pick != token
            tolerated = flip and is_near_tie(cpu_rows[r], token, pick, tol)
            logits = compare(f"step {i} logits", hyb_rows[r], cpu_rows[r], tol)
            check.steps.append(
                GenerationStep(
                    step=i,
                    cpu_token=token,
                    hybrid_pick=pick,
                    cpu_margin=top2_margin(cpu_rows[r]),
                    logits=logits,
                    tolerated_flip=tolerated,
                )
            )
            ok = ok and logits.passed and (not flip or tolerated)
            if flip and first is None:
                first = i
        if first is None:
            check.hybrid_tokens = list(cpu.tokens)
        else:
            head = [*cpu.tokens[:first], check.steps[first].hybrid_pick]
            rest = recompute_generate(model.forward, hyb_embed, ids + head, steps - len(head), limits)
            forwards += len(rest.tokens)
            check.hybrid_tokens = head + rest.tokens
            s = check.steps[first]
            r = first
            check.divergence_note = (
                f"cpu {s.cpu_token}, hybrid {s.hybrid_pick}; the CPU prefers {s.cpu_token} by "
                f"{lead(cpu_rows[r], s.cpu_token, s.hybrid_pick):.4g} (top-2 margin {s.cpu_margin:.4g}, "
                f"{'a near-tie, tolerated' if s.tolerated_flip else 'NOT a near-tie'})"
            )
        check.first_divergence = first
        check.hybrid_seconds = time.perf_counter() - t0
        check.hybrid_forwards = forwards
        check.cpu_text = _decode(tokenizer, check.cpu_tokens)
        check.hybrid_text = _decode(tokenizer, check.hybrid_tokens)
        check.passed = ok
    except Exception as exc:
        log.debug("generation failed", exc_info=True)
        check.problem = _problem(exc)
        check.passed = False
    return check


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


def _step_rows(
    forward: Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]],
    embed: Callable[[list[int]], np.ndarray],
    seq: list[int],
    prompt_len: int,
    limits: list[int],
) -> tuple[list[np.ndarray], int]:
    """Per generated token of ``seq``, the logits row that picked it, at the length the greedy loop ran that step
    (``fit_block``); one forward per length: its longest prefix gives every shorter one's rows (causal mask)."""
    sizes = [fit_block(n, limits) for n in range(prompt_len, len(seq))]
    longest = {size: prompt_len + i for i, size in enumerate(sizes)}
    rows = {size: _rows(forward(llm_inputs(embed(seq[:n]), size, 0))) for size, n in longest.items()}
    return [rows[size][prompt_len - 1 + i] for i, size in enumerate(sizes)], len(rows)


def _rows(outputs: Mapping[str, Any]) -> np.ndarray:
    logits = np.asarray(outputs["logits"])
    return logits.reshape(-1, logits.shape[-1])
