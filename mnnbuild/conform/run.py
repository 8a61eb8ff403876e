"""Run a bundle and its original model through MNN's own ``Llm`` engine and compare them.

Three runs per prompt, each by our driver (greedy, real decode path with the KV cache, per-step logits):
``bundle`` (the bundle's ``config_qnn.json``: CPU ops in MNN, every Plugin in the HTP simulator),
``original`` (the original model on MNN's CPU with the bundle's ``chunk_limits``, at full precision:
`REFERENCE_PRECISION`, the reference verify compares against; the bundle keeps its own precision and memory)
and ``unchunked`` (the same without ``chunk_limits``: no padding, the CPU bug's control). Prompts: shorter
than the chunk (the bundle's ``prompt.txt``, lengthened to 16 tokens), exactly one chunk, and two chunks
(the second one padded). Every run gets `ENGINE_SETTINGS` (CPU, one thread, greedy), not the model's
``config.json`` settings. The bundle must equal the original token for token and per-step logits must agree
within verify's tolerance; ``llm_demo`` on the bundle is a smoke test.

The x86 HTP library refuses weight-shared context binaries ("Shared weights buffer isn't supported on this
platform"); when the shipped binaries fail to load for that reason, the bundle runs with the unshared twins
the twin stage built (:func:`~mnnbuild.verify.checks.read_twins`, as verify runs them) in their place, and
the report says so per binary.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from mnnbuild_runtime.speculative import ENGINE_FULL_PRECISION
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mnnbuild.base.compare import TensorCheck, Tolerance, compare
from mnnbuild.base.errors import ConformError, MnnbuildError, field_problems
from mnnbuild.base.fsutil import atomic_write_text, confined, read_json_object, sha256_bytes, sha256_file
from mnnbuild.conform.boundaries import BoundaryReport, format_boundaries
from mnnbuild.conform.build import MnnBuild
from mnnbuild.conform.effect import PatchEffect, RunTokens, format_effect, length_effect, padding, summarize
from mnnbuild.conform.workdir import claim_dir, fresh_dir
from mnnbuild.manifests.partition import read_merge
from mnnbuild.mnn.llm import MODEL_CONFIG
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.layout import PROMPT_FILE
from mnnbuild.qnn.library import find_qnn_libraries
from mnnbuild.verify.compare import is_near_tie

log = logging.getLogger(__name__)

SHARED_WEIGHTS_REFUSAL = "Shared weights buffer isn't supported"
BUNDLE_CONFIG = "config_qnn.json"
#: Settings of the bundle's config that the original model runs with too: the same prefill chunks (and padding).
RUNTIME_KEYS = ("chunk_limits",)
#: The bundle's own precision settings (its ``config_qnn.json``, the model's as on the phone); the bundle keeps them.
PRECISION_KEYS = ("precision", "memory")
#: The reference runs (original, unchunked) are the model at full precision, the reference verify compares against
#: too (`ENGINE_FULL_PRECISION`): with llmexport's default ``memory: low`` MNN's CPU quantizes activations to int8 on
#: the fly for quantized weights, an approximation of its own (5.3% of the max |logit| on the tiny Eagle target)
#: that is not the model's answer and would be charged to the bundle.
REFERENCE_PRECISION: dict[str, object] = dict(ENGINE_FULL_PRECISION)
REFERENCE_WHY = (
    "full precision, the reference verify compares against: memory 'low' would quantize activations to int8 on the "
    "CPU, an error of MNN's CPU, not of the model"
)
BUNDLE_WHY = "the bundle's own config_qnn.json (the model's settings), as the phone runs it"
#: Set on every run's config, whatever the model's config.json holds: the outer graph on MNN's CPU (which loads the
#: plugins), one thread (comparable times on a shared machine), greedy decoding (for llm_demo too; the driver
#: also sets it).
ENGINE_SETTINGS: dict[str, object] = {"backend_type": "cpu", "thread_num": 1, "sampler_type": "greedy"}
DRIVER_TIMEOUT_S = 1800


class BinaryRun(BaseModel):
    binary: str
    ran: str
    """``shipped`` or ``twin``."""
    sha256: str
    reason: str | None = None


class EngineRun(BaseModel):
    tokens: list[int]
    """The stepped greedy loop's tokens (argmax of the dumped logits)."""
    engine_loop_tokens: list[int]
    """Llm::generate with the greedy sampler (the engine's own decode loop); may stop early at an end token. With
    ``speculative_type = "eagle"`` (EagleGeneration) the count of target forwards it appends is not among them, and
    its last forward may accept tokens past the requested number."""
    engine_forwards: int | None = None
    """EagleGeneration's target forwards after the prompt's (None: not a speculative run)."""
    engine_accepted_per_forward: float | None = None
    """New tokens after the prompt's own per target forward, as EagleGeneration counts them."""
    text: str
    load_s: float
    prefill_s: float
    decode_s: float
    generate_s: float


class StepCheck(BaseModel):
    step: int
    original_token: int
    bundle_token: int
    logits: TensorCheck
    tolerated_flip: bool


class PromptCheck(BaseModel):
    name: str
    prompt_tokens: int
    bundle: EngineRun | None = None
    original: EngineRun | None = None
    unchunked: EngineRun | None = None
    steps: list[StepCheck] = []
    first_divergence: int | None = None
    tokens_equal: bool = False
    engine_loop_agrees: bool = False
    """Every run's Llm::generate tokens are a prefix of (or equal to) its stepped tokens."""
    passed: bool = False
    problem: str | None = None


class SmokeCheck(BaseModel):
    command: str
    exit_code: int
    seconds: float
    output_tail: list[str]
    passed: bool


class RunSettings(BaseModel):
    """What one run's engine was set to, and why."""

    precision: str | None
    memory: str | None
    """None: the key is not in the config (MNN's default)."""
    chunk_limits: list[int] | None
    why: str


class ConformReport(BaseModel):
    model: str
    arch: str
    soc: str
    mnn_build: str
    mnn_source: str
    patches: list[str]
    chunk: int
    max_new_tokens: int
    tolerance: Tolerance
    binaries: list[BinaryRun]
    runs: dict[str, RunSettings] = {}
    """Per run (``bundle``, ``original``, ``unchunked``): the precision and memory its engine ran with, and why."""
    prompts: list[PromptCheck]
    llm_demo: SmokeCheck | None = None
    unchunked_agrees: bool = False
    """The original model gives the same tokens with and without chunk_limits padding (the CPU bug's check)."""
    seconds: float = 0.0
    passed: bool = False
    """Prompts and llm_demo; the boundary comparison and the patch effect are findings, not part of the verdict."""
    boundaries: BoundaryReport | None = None
    patch_effect: PatchEffect | None = None


def engine_env(build: MnnBuild) -> dict[str, str]:
    env = dict(os.environ)
    dirs = [str(d) for d in build.lib_dirs()] + [str(find_qnn_libraries().lib_dir)]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    return env


def stage_dir(src: Path, dest: Path, replace: dict[str, bytes], config: dict[str, object], config_name: str) -> Path:
    """``dest``: symlinks to every file of ``src`` but the replaced ones (written) and the config (ours). ``dest`` is
    one of conform's subdirs of its report dir (:func:`~mnnbuild.conform.workdir.fresh_dir`)."""
    fresh_dir(dest)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if not path.is_file() or rel in replace or rel == config_name:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).symlink_to(path.resolve())
    for rel, data in replace.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / config_name, json.dumps(config, indent=2) + "\n")
    return dest / config_name


def run_configs(
    bundle: dict[str, object], original: dict[str, object]
) -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    """The configs of the bundle, original and unchunked runs: each with `ENGINE_SETTINGS`; the bundle keeps its own
    precision and memory, the originals take the bundle's `RUNTIME_KEYS` and run at `REFERENCE_PRECISION`, the
    unchunked one without ``chunk_limits``."""
    bundle = {**bundle, **ENGINE_SETTINGS}
    original = {**original, **{k: bundle[k] for k in RUNTIME_KEYS if k in bundle}, **REFERENCE_PRECISION}
    original.update(ENGINE_SETTINGS)
    unchunked = {k: v for k, v in original.items() if k != "chunk_limits"}
    return bundle, original, unchunked


def run_settings(configs: dict[str, dict[str, object]]) -> dict[str, RunSettings]:
    """Per run label (``bundle``, ``original``, ``unchunked``), the precision settings its config holds, and why."""
    out = {}
    for label, config in configs.items():
        limits = config.get("chunk_limits")
        out[label] = RunSettings(
            precision=_str_or_none(config.get("precision")),
            memory=_str_or_none(config.get("memory")),
            chunk_limits=[int(x) for x in limits] if isinstance(limits, list) else None,
            why=BUNDLE_WHY if label == "bundle" else REFERENCE_WHY,
        )
    return out


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


#: The speculative strategy whose Llm::generate appends its forward count to the tokens.
EAGLE = "eagle"


def split_engine_loop(generated: list[int], speculative: bool) -> tuple[list[int], int | None]:
    """Llm::generate's tokens and, for a speculative run, the target forwards: EagleGeneration pushes its count of
    forwards after the prompt's as one more element of its output tokens when it stops (max tokens or an end token).
    Each forward accepts at least one token after the one the prompt's forward gives, so a count outside
    1..len(tokens) - 1 is no count: ConformError."""
    if not speculative:
        return list(generated), None
    tokens, forwards = list(generated[:-1]), generated[-1] if generated else 0
    if not 1 <= forwards <= len(tokens) - 1:
        raise ConformError(
            f"Llm::generate with speculative_type {EAGLE!r} returned {generated}: expected the tokens, then a count "
            "of target forwards between 1 and the tokens after the first"
        )
    return tokens, forwards


def is_speculative(config: Path) -> bool:
    return read_json_object(config, ConformError).get("speculative_type") == EAGLE


DRIVER_JSON = '{"stepped"'
"""How the driver's result line starts (its first key)."""


class DriverResult(BaseModel):
    """The driver's result line (conform_driver.cpp): the stepped tokens, one per new token asked for, the engine
    loop's, the text and the timings."""

    model_config = ConfigDict(strict=True)

    stepped: list[Annotated[int, Field(ge=0)]]
    generated: list[int]
    text: str
    load_s: float
    prefill_s: float
    decode_s: float
    generate_s: float


def driver_result(stdout: str) -> dict[str, Any] | None:
    """The driver's JSON result from its stdout, or None. The QNN backend may print to stdout without a newline
    just before it ("unable to load libcdsprpc.so" on x86), so the JSON starts where its first key does."""
    for line in reversed(stdout.splitlines()):
        if DRIVER_JSON in line:
            try:
                doc = json.loads(line[line.index(DRIVER_JSON) :])
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def run_driver(
    driver: Path, build: MnnBuild, config: Path, ids: list[int], max_new: int, chunk: int, logits_path: Path
) -> tuple[EngineRun | None, np.ndarray | None, str]:
    """One driver run; returns (result, logits rows, combined output). A failed run returns (None, None, output)."""
    cmd = [str(driver), str(config), ",".join(map(str, ids)), str(max_new), str(chunk), str(logits_path)]
    proc = subprocess.run(
        cmd, cwd=config.parent, capture_output=True, env=engine_env(build), timeout=DRIVER_TIMEOUT_S, check=False
    )
    out = proc.stdout.decode("utf-8", errors="replace")
    err = proc.stderr.decode("utf-8", errors="replace")
    combined = out + err
    doc = driver_result(out)
    if proc.returncode != 0 or doc is None:  # its exit code last: a crash says nothing else
        return None, None, f"{combined}\n(exit code {proc.returncode})"
    try:
        result = DriverResult.model_validate(doc)
    except ValidationError as exc:
        return None, None, f"{combined}\n{driver}: invalid result line: {field_problems(exc)}"
    n = len(result.stepped)
    try:
        rows = np.fromfile(logits_path, dtype=np.float32)
    except OSError as exc:
        return None, None, f"{combined}\n{logits_path}: cannot read the driver's logits: {exc.strerror}"
    if n != max_new or not rows.size or rows.size % n:
        why = f"{n} stepped tokens and {rows.size} logits in {logits_path.name}; expected {max_new} and a row each"
        return None, None, f"{combined}\n{driver}: {why}"
    try:
        loop, forwards = split_engine_loop(result.generated, is_speculative(config))
    except ConformError as exc:
        return None, None, f"{combined}\n{exc}"
    run = EngineRun(
        tokens=result.stepped,
        engine_loop_tokens=loop,
        engine_forwards=forwards,
        engine_accepted_per_forward=(len(loop) - 1) / forwards if forwards else None,
        **result.model_dump(include={"text", "load_s", "prefill_s", "decode_s", "generate_s"}),
    )
    return run, rows.reshape(n, -1), combined


#: Text that lengthens the bundle's prompt to one and two chunks (any text does; this one has varied tokens).
FILLER = (
    " The build system reads a model, cuts its graph into parts for the processor and the accelerator,"
    " compiles each accelerator part ahead of time, and checks that the result answers like the original."
    " Every stage writes its outputs atomically and records what it read, so a second run does nothing."
)


#: The short prompt has at least this many tokens: a one-token prompt runs through the decode graph unpadded
#: (``chunk_limits`` holds 1), so it would test neither the padded prefill nor the CPU bug.
SHORT_MIN_TOKENS = 16


def prompt_ids(base: list[int], filler: list[int], chunk: int) -> list[tuple[str, list[int]]]:
    """Shorter than the chunk (the bundle's prompt, lengthened with ``filler`` to ``SHORT_MIN_TOKENS``), exactly
    one chunk, and two chunks (1.5 chunks: the second one padded); each starts with the bundle's prompt."""
    if not base or not filler:
        raise ConformError("the bundle's prompt or the filler text encodes to no tokens")
    short_len = max(len(base), min(SHORT_MIN_TOKENS, chunk - 1))
    if short_len >= chunk:
        raise ConformError(f"the bundle's prompt has {len(base)} tokens; the short prompt must be below the chunk")
    return [
        (name, lengthen(base, filler, n))
        for name, n in (("short", short_len), ("chunk", chunk), ("two chunks", chunk + chunk // 2))
    ]


def lengthen(base: list[int], filler: list[int], n: int) -> list[int]:
    """``n`` tokens: the bundle's prompt, then the filler repeated (cut to ``n``)."""
    return (base + filler * (n // len(filler) + 1))[:n]


def _loop_agrees(run: EngineRun) -> bool:
    """The engine loop's tokens are the stepped ones as far as both go; only a speculative loop may go further (its
    last forward accepts what it accepts), a plain one stops at the requested number or before."""
    loop = run.engine_loop_tokens
    n = min(len(loop), len(run.tokens))
    longer_ok = run.engine_forwards is not None or len(loop) <= len(run.tokens)
    return n > 0 and longer_ok and loop[:n] == run.tokens[:n]


def compare_runs(check: PromptCheck, bundle_rows: np.ndarray, original_rows: np.ndarray, tol: Tolerance) -> None:
    """Per step along the original's tokens, up to and including the first divergence (after it the two
    sequences differ, so their logits answer different questions)."""
    assert check.bundle is not None and check.original is not None
    ok = True
    for i, (ref, got) in enumerate(zip(check.original.tokens, check.bundle.tokens, strict=True)):
        flip = ref != got
        tolerated = flip and is_near_tie(original_rows[i], ref, got, tol)
        logits = compare(f"step {i} logits", bundle_rows[i], original_rows[i], tol)
        check.steps.append(
            StepCheck(step=i, original_token=ref, bundle_token=got, logits=logits, tolerated_flip=tolerated)
        )
        ok = ok and logits.passed and (not flip or tolerated)
        if flip:
            check.first_divergence = i
            break
    check.tokens_equal = check.bundle.tokens == check.original.tokens
    runs = [r for r in (check.bundle, check.original, check.unchunked) if r is not None]
    check.engine_loop_agrees = all(_loop_agrees(r) for r in runs)
    check.passed = ok and check.tokens_equal and check.engine_loop_agrees


def twin_reason(output: str, shared: list[str]) -> str:
    """Why the bundle runs with the unshared twins in place of its shipped binaries, from what MNN's engine said on
    them (``output``, its exit code last: `run_driver`) and which of them share their weights (``shared``)."""
    if SHARED_WEIGHTS_REFUSAL in output:
        said = f"the x86 QNN library refuses the shipped weight-shared binaries: '{SHARED_WEIGHTS_REFUSAL}'"
    else:
        said = f"MNN's engine failed on the shipped binaries: {_last_lines(output)}"
        if shared:
            said += f"; {len(shared)} of them share their weights, which this x86 QNN library cannot load"
    return f"{said}: their unshared twins ran in their place"


def _twins(context_dir: Path, twin_dir: Path, merge: dict[str, list[str]], target: str) -> dict[str, bytes]:
    """The unshared twins the twin stage built (hash checked against its manifests); a missing one names the doit
    task that builds it (``target``: ``<model>-<arch>``)."""
    from mnnbuild.verify.checks import read_contexts, read_twins

    contexts, problems = read_contexts(context_dir, merge)
    if problems:
        raise ConformError(f"{problems[0]}; run `doit bundle:{target}`")
    twins, more = read_twins(twin_dir, contexts, merge)
    if more:
        raise ConformError(f"{more[0]}; run `doit twin:{target}` (the unshared twins the simulator runs)")
    try:
        return {path: twin.read() for path, twin in twins.items()}
    except MnnbuildError as exc:
        raise ConformError(str(exc)) from None


def _shipped_sha256(bundle_model_dir: Path, binary: str, model: str, arch: str) -> str:
    """The sha256 of a binary the bundle ships (``npu_postreat.json``'s merge names it); a missing one is one line."""
    try:
        return sha256_file(confined(bundle_model_dir, binary, f"bundle {bundle_model_dir}: plugin binary"))
    except (OSError, MnnbuildError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConformError(
            f"bundle {bundle_model_dir}: cannot read its plugin binary {binary!r} ({why}); run `doit "
            f"bundle:{model}-{arch}`"
        ) from None


def conform_model(
    *,
    model: str,
    arch: str,
    soc: Soc,
    bundle_model_dir: Path,
    original_dir: Path,
    context_dir: Path,
    twin_dir: Path,
    partition_dir: Path,
    out_dir: Path,
    build: MnnBuild,
    driver: Path,
    max_new_tokens: int = 16,
    tol: Tolerance | None = None,
) -> ConformReport:
    """Run the three prompts through MNN's engine for bundle, original and unchunked original. The bundle is opened
    as the runtime opens it first (`Bundle.open`, `check_engine_files`): its config is handed to MNN's engine, which
    opens (and, ``tmp_path``, writes) what it names, so nothing it names may lead outside the bundle."""
    from mnnbuild_runtime import Bundle, Tokenizer
    from mnnbuild_runtime.bundle import check_engine_files

    started = time.perf_counter()
    tol = tol or Tolerance()
    try:
        bundle_config = Bundle.open(bundle_model_dir, BUNDLE_CONFIG).config
        check_engine_files(bundle_model_dir / BUNDLE_CONFIG, bundle_config)
    except MnnbuildError as exc:
        raise ConformError(f"bundle {bundle_model_dir}: {exc}") from None
    limits = bundle_config.get("chunk_limits")
    if not isinstance(limits, list) or not limits or not all(isinstance(x, int) for x in limits):
        raise ConformError(f"{bundle_model_dir / BUNDLE_CONFIG}: field 'chunk_limits' must be a list of ints")
    chunk = max(limits)
    original_json = read_json_object(original_dir / MODEL_CONFIG, ConformError)
    bundle_config, original_config, unchunked_config = run_configs(bundle_config, original_json)
    merge = read_merge(partition_dir)
    binaries = [BinaryRun(binary=b, ran="shipped", sha256=_shipped_sha256(bundle_model_dir, b, model, arch))
                for b in merge]  # fmt: skip
    claim_dir(out_dir)

    orig_cfg = stage_dir(original_dir, out_dir / "original", {}, original_config, MODEL_CONFIG)
    unch_cfg = stage_dir(original_dir, out_dir / "unchunked", {}, unchunked_config, MODEL_CONFIG)
    try:
        prompt_text = (bundle_model_dir / PROMPT_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConformError(f"{bundle_model_dir / PROMPT_FILE}: cannot read the bundle's prompt: {exc}") from None
    tokenizer = Tokenizer(orig_cfg, links=True)  # staged: links to the model's files
    prompts = prompt_ids(tokenizer.encode(prompt_text), tokenizer.encode(FILLER), chunk)

    # the shipped binaries first; twins only if the x86 library refuses them
    bundle_cfg = stage_dir(bundle_model_dir, out_dir / "bundle", {}, bundle_config, BUNDLE_CONFIG)
    probe, _, output = run_driver(driver, build, bundle_cfg, prompts[0][1], 1, chunk, out_dir / "probe.f32")
    if probe is None:
        from mnnbuild.verify.checks import read_contexts

        contexts, _ = read_contexts(context_dir, merge)
        reason = twin_reason(output, [b for b in merge if b in contexts and contexts[b].weight_shared])
        log.warning("conform: %s", reason)
        twins = _twins(context_dir, twin_dir, merge, f"{model}-{arch}")
        binaries = [BinaryRun(binary=b, ran="twin", sha256=sha256_bytes(twins[b]), reason=reason) for b in merge]
        bundle_cfg = stage_dir(bundle_model_dir, out_dir / "bundle", twins, bundle_config, BUNDLE_CONFIG)

    report = ConformReport(
        model=model,
        arch=arch,
        soc=soc.name,
        mnn_build=build.record.key,
        mnn_source=build.record.source,
        patches=build.record.patches,
        chunk=chunk,
        max_new_tokens=max_new_tokens,
        tolerance=tol,
        binaries=binaries,
        runs=run_settings({"bundle": bundle_config, "original": original_config, "unchunked": unchunked_config}),
        prompts=[],
    )
    unchunked_same = True
    for name, ids in prompts:
        check = PromptCheck(name=name, prompt_tokens=len(ids))
        rows: dict[str, np.ndarray] = {}
        for label, cfg in (("bundle", bundle_cfg), ("original", orig_cfg), ("unchunked", unch_cfg)):
            slug = name.replace(" ", "_")
            run, logits, output = run_driver(
                driver, build, cfg, ids, max_new_tokens, chunk, out_dir / f"{label}-{slug}.f32"
            )
            if run is None:
                check.problem = f"{label} run failed: {_last_lines(output)}"
                break
            setattr(check, label, run)
            assert logits is not None
            rows[label] = logits
        if check.problem is None:
            compare_runs(check, rows["bundle"], rows["original"], tol)
            assert check.unchunked is not None and check.original is not None
            unchunked_same = unchunked_same and check.unchunked.tokens == check.original.tokens
        report.prompts.append(check)
    report.unchunked_agrees = unchunked_same
    report.llm_demo = smoke_llm_demo(build, bundle_cfg, max_new_tokens)
    report.seconds = time.perf_counter() - started
    report.passed = all(p.passed for p in report.prompts) and report.llm_demo.passed
    return report


def write_report(report: ConformReport, out_dir: Path) -> None:
    atomic_write_text(out_dir / "conform.json", report.model_dump_json(indent=2))
    atomic_write_text(out_dir / "conform.txt", format_report(report))


def staged_config(out_dir: Path, label: str) -> Path:
    """The config a conform run staged for ``bundle``, ``original`` or ``unchunked`` in ``out_dir``."""
    return out_dir / label / (BUNDLE_CONFIG if label == "bundle" else MODEL_CONFIG)


def measure_patch_effect(
    patch: str,
    with_patch: tuple[MnnBuild, Path],
    without_patch: tuple[MnnBuild, Path],
    out_dir: Path,
    lengths: list[int],
    max_new_tokens: int,
    tol: Tolerance | None = None,
) -> PatchEffect:
    """The bundle staged by :func:`conform_model` in ``out_dir`` through both builds (each with its driver), and
    the unchunked original through the patched one, at each prompt length."""
    from mnnbuild_runtime import Tokenizer

    tol = tol or Tolerance()
    bundle_cfg, unchunked_cfg = staged_config(out_dir, "bundle"), staged_config(out_dir, "unchunked")
    limits = read_json_object(bundle_cfg, ConformError)["chunk_limits"]
    assert isinstance(limits, list)
    chunk = max(limits)
    tokenizer = Tokenizer(staged_config(out_dir, "original"), links=True)  # staged: links to the model's files
    base = tokenizer.encode((bundle_cfg.parent / PROMPT_FILE).read_text(encoding="utf-8").strip())
    filler = tokenizer.encode(FILLER)
    work = out_dir / "patch-effect"
    work.mkdir(parents=True, exist_ok=True)
    effect = PatchEffect(
        patch=patch,
        build_with=with_patch[0].record.key,
        build_without=without_patch[0].record.key,
        chunk_limits=limits,
        max_new_tokens=max_new_tokens,
        lengths=[],
    )
    for n in lengths:
        ids = lengthen(base, filler, n)
        runs = {}
        for label, (build, driver), cfg in (
            ("with_patch", with_patch, bundle_cfg),
            ("without_patch", without_patch, bundle_cfg),
            ("reference", with_patch, unchunked_cfg),
        ):
            run, rows, output = run_driver(driver, build, cfg, ids, max_new_tokens, chunk, work / f"{label}-{n}.f32")
            if run is None or rows is None:
                raise ConformError(f"patch effect, {n} tokens, {label} run failed: {_last_lines(output)}")
            runs[label] = (RunTokens(tokens=run.tokens, text=run.text), rows)
        effect.lengths.append(length_effect(n, padding(n, limits), runs, tol))
    return summarize(effect)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "(no output)"


def smoke_llm_demo(build: MnnBuild, config: Path, max_new_tokens: int) -> SmokeCheck:
    """``llm_demo <config> prompt.txt <n>`` on the bundle, as run.sh does on the phone; must load and answer."""
    prompt = config.parent / PROMPT_FILE
    cmd = [str(build.llm_demo), str(config), str(prompt), str(max_new_tokens)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=config.parent, capture_output=True, env=engine_env(build), timeout=DRIVER_TIMEOUT_S)
    seconds = time.perf_counter() - t0
    text = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # llm_demo exits 0 even when loading fails; its own messages tell
    failed = proc.returncode != 0 or any("init error" in ln or "[Error]" in ln for ln in lines)
    answered = any("decode" in ln.lower() for ln in lines)
    return SmokeCheck(
        command=" ".join(cmd),
        exit_code=proc.returncode,
        seconds=seconds,
        output_tail=lines[-12:],
        passed=not failed and answered,
    )


def format_report(report: ConformReport) -> str:
    out = [
        f"conform {report.model}-{report.arch} ({report.soc}): {'PASSED' if report.passed else 'FAILED'} "
        f"in {report.seconds:.1f}s",
        f"MNN build {report.mnn_build} from {report.mnn_source}; patches: {', '.join(report.patches)}",
        f"chunk {report.chunk}, {report.max_new_tokens} new tokens, tolerance cosine >= {report.tolerance.min_cosine}, "
        f"max abs err <= {report.tolerance.max_rel_err:.0%} of ref max abs",
        "",
        "binaries that ran in the HTP simulator:",
    ]
    for b in report.binaries:
        out.append(f"  {b.binary}: {b.ran} (sha256 {b.sha256[:12]}…)" + (f" — {b.reason}" if b.reason else ""))
    if report.runs:
        out.append("precision of each run (MNN's CPU):")
        for label, r in report.runs.items():
            out.append(
                f"  {label:9s} precision {r.precision or 'default'}, memory {r.memory or 'default'}, chunk_limits "
                f"{r.chunk_limits or 'none'} — {r.why}"
            )
    out.append("")
    for p in report.prompts:
        verdict = "ok" if p.passed else "FAILED"
        out.append(
            f"prompt '{p.name}' ({p.prompt_tokens} tokens): {verdict}" + (f" — {p.problem}" if p.problem else "")
        )
        for label in ("bundle", "original", "unchunked"):
            run: EngineRun | None = getattr(p, label)
            if run is not None:
                out.append(
                    f"  {label:9s} {run.tokens}  {run.text!r}  (load {run.load_s:.2f}s, prefill {run.prefill_s:.3f}s, "
                    f"decode {run.decode_s:.3f}s)"
                )
        if p.steps:
            worst = max(p.steps, key=lambda s: s.logits.severity(report.tolerance))
            out.append(f"  worst step logits: {worst.logits.describe()}")
        if p.first_divergence is not None:
            out.append(f"  first divergence at step {p.first_divergence}")
        out.append(f"  engine's own loop (Llm::generate) agrees: {p.engine_loop_agrees}")
        for label in ("bundle", "original", "unchunked"):
            run = getattr(p, label)
            if run is not None and run.engine_forwards is not None:
                out.append(
                    f"  {label:9s} Llm::generate (eagle): {len(run.engine_loop_tokens)} tokens in {run.engine_forwards}"
                    f" target forwards after the prompt's, {run.engine_accepted_per_forward:.2f} accepted per forward"
                )
    out.append(f"original with chunk_limits = without (no padding effect): {report.unchunked_agrees}")
    if report.llm_demo:
        d = report.llm_demo
        out.append(
            f"llm_demo smoke: {'ok' if d.passed else 'FAILED'} (exit {d.exit_code}, {d.seconds:.1f}s): {d.command}"
        )
    if report.boundaries is not None:
        out += ["", *format_boundaries(report.boundaries)]
    if report.patch_effect is not None:
        out += ["", *format_effect(report.patch_effect)]
    return "\n".join(out) + "\n"
