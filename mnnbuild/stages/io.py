"""io: the reference input/output samples of the whole graph (upstream ``generateLlmIO``).

For the decode shape (1 token) and every prefill length (``chunk_sizes``, longest first) it writes
``testdir/<seq>/input.mnn`` and ``testdir/<seq>/output.mnn``: seeded random embeddings in
``input_ids`` ``[seq,1,hidden]``, a float causal mask ``[1,1,seq,seq]`` (lowest float above the
diagonal), ``position_ids`` ``[1,seq]`` and, for a text LLM, ``logits_index`` ``[1]`` (0 for prefill,
-1 for decode), and the model's outputs for them, computed by PyPI MNN on the CPU. Which graph and which
inputs come from the model part the fetch stage recorded (``mnnbuild.modeldir.ModelPart``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from mnnbuild.cpu import save_vars, to_numpy
from mnnbuild.cpu.segments import run_segmented
from mnnbuild.errors import MNNFormatError, ModelDirError
from mnnbuild.fsutil import staged_dir
from mnnbuild.layout import REFERENCE_INPUT, REFERENCE_OUTPUT, TESTDIR, testdir
from mnnbuild.manifest import FileRecord, record_outputs, tool_versions
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import DECODE_SEQ, IoInputs, IoManifest, IoParams, IoSample, TensorInfo
from mnnbuild.mnn import MnnModel, input_dtypes, load_model
from mnnbuild.modeldir import DEFAULT_PROMPT, LLM_CONFIG, ModelPart, read_llm_config
from mnnbuild.stage import Stage

log = logging.getLogger(__name__)


def make_inputs(seq_len: int, hidden_size: int, seed: int) -> dict[str, np.ndarray]:
    """The inputs of one sample; the generator is seeded by (seed, seq_len), so each shape is reproducible."""
    rng = np.random.default_rng([seed, seq_len])
    lowest = np.finfo(np.float32).min
    mask = np.triu(np.full((seq_len, seq_len), lowest, dtype=np.float32), k=1)
    return {
        "input_ids": rng.random((seq_len, 1, hidden_size), dtype=np.float32),
        "attention_mask": mask.reshape(1, 1, seq_len, seq_len),
        "position_ids": np.arange(seq_len, dtype=np.int32).reshape(1, seq_len),
        "logits_index": np.array([-1 if seq_len == DECODE_SEQ else 0], dtype=np.int32),
    }


def _info(arrays: dict[str, np.ndarray]) -> list[TensorInfo]:
    return [TensorInfo(name=n, shape=list(a.shape), dtype=str(a.dtype)) for n, a in arrays.items()]


def _check_mask(part: ModelPart, model: MnnModel, model_file: Path, config: dict) -> None:
    """The mask the samples carry is float; the graph must take one (and, where MNN's engine builds the mask
    ``llm_config.json`` says, so must that file)."""
    if part.mask_from_llm_config and config["attention_mask"] != "float":
        raise ModelDirError(
            f"{model_file.parent / LLM_CONFIG}: field 'attention_mask' is {config['attention_mask']!r}; "
            'only "float" attention masks are supported'
        )
    declared = input_dtypes(model).get("attention_mask", "DT_FLOAT")
    if declared != "DT_FLOAT":
        raise ModelDirError(
            f"{model_file}: graph input 'attention_mask' is {declared}; only float attention masks are supported"
        )


def _check_prompt_fits(inputs: IoInputs, params: IoParams, model_dir: Path) -> None:
    """verify generates from the bundle's prompt inside the longest prefill chunk: refuse a chunk it cannot fit
    now, not after the whole build (imported here: io otherwise does not need the runtime)."""
    from mnnbuild_runtime import BundleError, Tokenizer

    try:
        prompt_tokens = len(Tokenizer(model_dir / "config.json").encode(DEFAULT_PROMPT.strip()))
    except BundleError as exc:
        raise ModelDirError(str(exc)) from None
    longest = max(params.chunk_sizes)
    if longest <= prompt_tokens:
        one = len(params.chunk_sizes) == 1
        field = f"'chunk_size' is {longest}" if one else f"'chunk_sizes' is {list(params.chunk_sizes)}"
        raise ModelDirError(
            f"{inputs.model}: spec field {field}, but verify's prompt {DEFAULT_PROMPT.strip()!r} is {prompt_tokens} "
            f"tokens and generation needs room after it; expected {'chunk_size' if one else 'the longest length'} "
            f">= {prompt_tokens + 1}"
        )


def generate_io(inputs: IoInputs, params: IoParams, out_dir: Path) -> IoManifest:
    """Run the whole graph on the decode and every prefill sample and save inputs and outputs."""
    model_dir = Path(inputs.model_dir)
    fetched = inputs.manifest(FetchManifest, model_dir)
    part = fetched.part
    config = read_llm_config(model_dir)
    model_file, weight_file = model_dir / part.model_file, model_dir / part.weight_file
    try:
        model = load_model(model_file)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    _check_mask(part, model, model_file, config)
    hidden = config["hidden_size"]
    if part.generates:
        _check_prompt_fits(inputs, params, model_dir)
    rt = params.runtime.create(weight_file)
    names, out_names = list(model.input_names), list(model.output_names)
    unknown = sorted(set(names) - set(part.inputs))
    if unknown:
        raise ModelDirError(
            f"{model_file}: graph input {unknown[0]!r} is not an {'LLM' if part.family == 'llm' else part.family} "
            f"input; expected inputs among {', '.join(part.inputs)}"
        )

    seq_lens = (DECODE_SEQ, *params.chunk_sizes)
    feeds = [{n: make_inputs(seq_len, hidden, params.seed)[n] for n in names} for seq_len in seq_lens]
    try:
        computed = run_segmented(model_file, rt, model, feeds, out_names, label=inputs.model)
    except MNNFormatError as exc:  # MNN failed inside forward (it prints why, returns fewer outputs)
        raise ModelDirError(f"{exc}; is {weight_file} this model's weight file?") from None
    samples = []
    with staged_dir(out_dir) as tmp:
        for seq_len, feed, outputs in zip(seq_lens, feeds, computed, strict=True):
            results = {n: to_numpy(outputs[n]) for n in out_names}
            for n, a in results.items():
                if a.dtype.kind == "f" and not np.isfinite(a).all():
                    raise ModelDirError(f"{model_file}: output {n!r} has non-finite values at seq {seq_len}")
            sample_dir = testdir(tmp, seq_len)
            sample_dir.mkdir(parents=True)
            save_vars(sample_dir / REFERENCE_INPUT, feed, nhwc=("logits_index",))
            save_vars(sample_dir / REFERENCE_OUTPUT, results)
            samples.append(
                IoSample(seq_len=seq_len, dir=f"{TESTDIR}/{seq_len}", inputs=_info(feed), outputs=_info(results))
            )
            log.info(
                "io %s: seq %d -> %s",
                inputs.model,
                seq_len,
                ", ".join(f"{n}{list(a.shape)}" for n, a in results.items()),
            )
        used = {part.model_file, part.weight_file, LLM_CONFIG}
        manifest = IoManifest(
            model=inputs.model,
            inputs=[
                FileRecord(path=f"model/{r.path}", size=r.size, sha256=r.sha256)
                for r in fetched.outputs
                if r.path in used
            ],
            params=params,
            tools=tool_versions(mnn=True),
            outputs=record_outputs(tmp),
            samples=samples,
        )
        manifest.write(tmp)
    return manifest


STAGE = Stage(
    name="io",
    entry=generate_io,
    inputs=IoInputs,
    params=IoParams,
    manifest=IoManifest,
    upstream=("fetch",),
    outputs=(TESTDIR,),
    tools=frozenset({"MNN"}),
    doc="Generate each model's decode/prefill reference inputs and outputs.",
)
