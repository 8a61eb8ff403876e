"""io: the reference input/output samples of the whole graph (upstream ``generateLlmIO``).

For the decode shape (1 token) and every prefill length (``chunk_sizes``, longest first) it writes
``testdir/<seq>/input.mnn`` and ``testdir/<seq>/output.mnn``: seeded random embeddings in
``input_ids`` ``[seq,1,hidden]``, a float causal mask ``[1,1,seq,seq]`` (lowest float above the
diagonal), ``position_ids`` ``[1,seq]`` and, for a text LLM, ``logits_index`` ``[1]`` (0 for prefill,
-1 for decode), and the model's outputs for them, computed by PyPI MNN on the CPU. A speculative build (the fetch
manifest's ``speculation``) also gets a sample at the verify length, ``draft_predict_length + 1`` tokens with
``logits_index`` 0, as MNN's engine checks a draft; an Eagle target's outputs include ``hidden_states``. Which graph
and which inputs come from the model part the fetch stage recorded (``mnnbuild.model.modeldir.ModelPart``).

A VL language model (M-RoPE) takes ``position_ids`` ``[3,seq]`` with a stand-in image in the prefill samples,
and Qwen3-VL's also ``deepstack_embeds`` ``[3,seq,hidden]`` (docs/families.md section 3.1); the inputs fed are the
model's own. A VL model's encoder (``visual.mnn``, the ``visual`` chain) gets one sample per image size,
``testdir/<patches>``, its inputs built by ``mnnbuild.model.visual`` (section 3.2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import MNNFormatError, ModelDirError
from mnnbuild.base.fsutil import staged_dir
from mnnbuild.base.logs import progress
from mnnbuild.cpu import save_vars, to_numpy
from mnnbuild.cpu.segments import iter_segmented
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import DECODE_SEQ, IoInputs, IoManifest, IoParams, IoSample, TensorInfo
from mnnbuild.mnn import MnnModel, input_dtypes, load_model
from mnnbuild.mnn.llm import DEEPSTACK_INPUT, MODEL_CONFIG, causal_mask
from mnnbuild.model.modeldir import (
    LLM_CONFIG,
    VISUAL,
    ModelPart,
    chain_part,
    check_hidden_size,
    read_llm_config,
)
from mnnbuild.model.spec import VISUAL_ENCODERS, ImageSize, ModelSpec
from mnnbuild.model.visual import visual_inputs
from mnnbuild.pipeline.layout import REFERENCE_INPUT, REFERENCE_OUTPUT, TESTDIR, testdir
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage

log = logging.getLogger(__name__)


Feed = dict[str, np.ndarray]

IMAGE_GRID = (2, 3)
"""The merged-token grid (rows, columns) of the stand-in image in a VL prefill sample."""


def mrope_positions(seq_len: int, rows: int) -> tuple[np.ndarray, slice]:
    """``position_ids [rows, seq]`` of a prompt with a stand-in image, and the image tokens' span.

    One row (a text LLM): ``0..seq-1``. Several (M-RoPE: time, height, width): text tokens carry their position
    in every row; when the sample has room, tokens ``1 ..`` are an image of :data:`IMAGE_GRID` merged tokens,
    which all share the time position and take their grid row and column in the other rows, and the text after it
    goes on from the largest position used (the scheme Qwen2-VL's rope index follows)."""
    grid_h, grid_w = IMAGE_GRID
    start, count = 1, grid_h * grid_w
    if rows == 1 or seq_len <= start + count:
        return np.tile(np.arange(seq_len, dtype=np.int32), (rows, 1)), slice(0, 0)
    pos = np.zeros((rows, seq_len), dtype=np.int32)
    pos[:, :start] = np.arange(start)
    cell = np.arange(count)
    pos[0, start : start + count] = start
    pos[1:, start : start + count] = start + cell // grid_w
    pos[2:, start : start + count] = start + cell % grid_w
    after = start + max(grid_h, grid_w)
    pos[:, start + count :] = np.arange(after, after + seq_len - start - count)
    return pos, slice(start, start + count)


def make_inputs(
    seq_len: int, hidden_size: int, seed: int, declared: dict[str, list[int]] | None = None
) -> dict[str, np.ndarray]:
    """The inputs of one sample; the generator is seeded by (seed, seq_len), so each shape is reproducible.

    ``declared`` (the model's input dims) sizes what varies by model: M-RoPE's ``position_ids`` rows (``[3, -1]``)
    and Qwen3-VL's ``deepstack_embeds`` (``[3, seq, hidden]``: what MNN's runtime feeds, the stand-in image's
    rows random, the text's zero)."""
    declared = declared or {}
    rng = np.random.default_rng([seed, seq_len])
    rows = declared.get("position_ids", [1])[0]
    positions, image = mrope_positions(seq_len, rows if rows > 0 else 1)
    feed = {
        "input_ids": rng.random((seq_len, 1, hidden_size), dtype=np.float32),
        "attention_mask": causal_mask(seq_len),
        "position_ids": positions,
        "logits_index": np.array([-1 if seq_len == DECODE_SEQ else 0], dtype=np.int32),
    }
    if DEEPSTACK_INPUT in declared:
        deepstack = np.zeros((declared[DEEPSTACK_INPUT][0], seq_len, hidden_size), dtype=np.float32)
        deepstack[:, image] = rng.standard_normal(deepstack[:, image].shape, dtype=np.float32)
        feed[DEEPSTACK_INPUT] = deepstack
    return feed


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


def _warn_zero_epsilon(model: MnnModel, model_file: Path) -> None:
    """A norm with epsilon 0 turns an all-zero row into 0/0 (llmexport writes GLM-4's 1.5625e-07 as 0.0): say so
    before verify meets the NaN."""
    zero = [op.name for op in model.ops_of_type("LayerNorm") if op.main is not None and float(op.main.epsilon) == 0.0]
    if zero:
        log.warning(
            "%s: %d LayerNorm ops have epsilon 0 (first %r): an all-zero input row gives 0/0 = NaN; "
            "the exporter dropped the model's epsilon",
            model_file,
            len(zero),
            zero[0],
        )


def _check_prompt_fits(inputs: IoInputs, params: IoParams, model_dir: Path) -> None:
    """verify generates from the bundle's prompt inside the longest prefill chunk: refuse a chunk it cannot fit
    now, not after the whole build (imported here: io otherwise does not need the runtime)."""
    from mnnbuild_runtime import BundleError, Tokenizer

    try:
        prompt_tokens = len(Tokenizer(model_dir / MODEL_CONFIG, links=True).encode(params.prompt))
    except BundleError as exc:
        raise ModelDirError(str(exc)) from None
    longest = max(params.chunk_sizes)
    if longest <= prompt_tokens:
        one = len(params.chunk_sizes) == 1
        field = f"'chunk_size' is {longest}" if one else f"'chunk_sizes' is {list(params.chunk_sizes)}"
        raise ModelDirError(
            f"{inputs.model}: spec field {field}, but verify's prompt {params.prompt!r} is {prompt_tokens} "
            f"tokens and generation needs room after it; expected {'chunk_size' if one else 'the longest length'} "
            f">= {prompt_tokens + 1}"
        )


def _config_limit(config: dict[str, Any], field: str, config_path: Path) -> int | None:
    limit = config.get(field)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise ModelDirError(f"{config_path}: field {field!r} must be a positive integer, got {limit!r}")
    return limit


def _check_model_bounds(params: IoParams, config: dict[str, Any], config_path: Path) -> None:
    """What the model itself bounds (the spec checked mnnbuild's own bounds): no prefill length beyond the positions
    it was trained for (``max_position_embeddings``, which llmexport writes and MNN's engine warns past), no image
    larger than MNN's engine resizes the model's images to (``image_max_pixels``)."""
    positions = _config_limit(config, "max_position_embeddings", config_path)
    if positions is not None and params.chunk_sizes and max(params.chunk_sizes) > positions:
        field = "chunk_size" if len(params.chunk_sizes) == 1 else "chunk_sizes"
        raise ModelDirError(
            f"{config_path}: field 'max_position_embeddings' is {positions}: the model has no positions beyond it, "
            f"but spec field {field!r} asks for a prefill length of {max(params.chunk_sizes)}; expected lengths "
            f"<= {positions}"
        )
    pixels = _config_limit(config, "image_max_pixels", config_path)
    for text in params.image_sizes:
        size = ImageSize.parse(text)
        if pixels is not None and size.width * size.height > pixels:
            raise ModelDirError(
                f"{config_path}: field 'image_max_pixels' is {pixels}: MNN's engine resizes every image to at most "
                f"that many pixels, so spec field 'image_sizes' entry {text!r} ({size.width * size.height} pixels) "
                "would never run"
            )


def _check_verify_length(verify: int, params: IoParams, model_dir: Path) -> None:
    """The verify forward must fit one prefill block (lookahead's goes through the engine's chunking, which asserts
    it): checked here when the length came from the model's config (the spec checks its own)."""
    longest = max(params.chunk_sizes)
    if verify > longest:
        raise ModelDirError(
            f"{model_dir / MODEL_CONFIG}: field 'draft_predict_length' is {verify - 1}: a verify forward of {verify} "
            f"tokens is longer than the longest prefill length {longest}; set spec field draft_predict_length "
            f"<= {longest - 1} or a longer chunk"
        )


def _visual_feed(params: IoParams, model: MnnModel, model_file: Path, config: dict[str, Any]) -> Callable[[int], Feed]:
    """A VL encoder's samples, one per image size in spec order, each made when asked for."""
    assert params.visual_encoder is not None
    encoder = VISUAL_ENCODERS[params.visual_encoder]
    expected = list(encoder.input_shapes(ImageSize(width=encoder.alignment, height=encoder.alignment)))
    if list(model.input_names) != expected:
        raise ModelDirError(
            f"{model_file}: inputs {list(model.input_names)}; a {encoder.kind} encoder takes {expected} "
            "(spec field 'visual_encoder')"
        )
    return lambda i: visual_inputs(encoder.kind, ImageSize.parse(params.image_sizes[i]), config, params.seed)


def generate_io(inputs: IoInputs, params: IoParams, out_dir: Path) -> IoManifest:
    """Run the whole graph on each sample (a language model: decode and every prefill length; a VL encoder: every
    image size) and save inputs and outputs. Samples are made one at a time and written as soon as MNN computed
    them (:func:`~mnnbuild.cpu.segments.iter_segmented`): memory follows the largest sample, not their sum."""
    model_dir = Path(inputs.model_dir)
    fetched = inputs.manifest(FetchManifest, model_dir)
    part = chain_part(fetched.part, params.part)
    config = read_llm_config(model_dir)
    model_file, weight_file = model_dir / part.model_file, model_dir / part.weight_file
    try:
        model = load_model(model_file)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    _check_model_bounds(params, config, model_dir / LLM_CONFIG)
    names, out_names = list(model.input_names), list(model.output_names)
    feed: Callable[[int], Feed]
    if part.family == "visual":
        feed = _visual_feed(params, model, model_file, config)
        encoder = VISUAL_ENCODERS[str(params.visual_encoder)]
        shapes = [(ImageSize.parse(t).patch_count(encoder), t) for t in params.image_sizes]
    else:
        _check_mask(part, model, model_file, config)
        _warn_zero_epsilon(model, model_file)
        check_hidden_size(config, model, model_dir, part.model_file)  # fetch checked the source; this, what io reads
        if part.generates:
            _check_prompt_fits(inputs, params, model_dir)
        unknown = sorted(set(names) - set(part.inputs))
        if unknown:
            kind = "LLM" if part.family == "llm" else part.family
            raise ModelDirError(
                f"{model_file}: graph input {unknown[0]!r} is not an {kind} input; "
                f"expected inputs among {', '.join(part.inputs)}"
            )
        lengths = (DECODE_SEQ, *params.chunk_sizes)
        if fetched.speculation is not None:
            _check_verify_length(fetched.speculation.verify_length, params, model_dir)
            lengths = fetched.speculation.graph_lengths(lengths)
        shapes = [(seq_len, None) for seq_len in lengths]
        declared, hidden = model.input_dims, config["hidden_size"]

        def llm_feed(i: int) -> Feed:
            return make_inputs(shapes[i][0], hidden, params.seed, declared)

        feed = llm_feed
    rt = params.runtime.create(weight_file)
    samples: list[IoSample] = []
    with staged_dir(out_dir) as tmp:
        spill = tmp / ".spill"
        spill.mkdir()
        fed: dict[int, list[TensorInfo]] = {}

        def sample(i: int) -> Feed:
            """Sample ``i``'s inputs, written to its testdir as they are made."""
            arrays = {n: a for n, a in feed(i).items() if n in names}
            arrays = {n: arrays[n] for n in names}
            sample_dir = testdir(tmp, shapes[i][0])
            sample_dir.mkdir(parents=True)
            save_vars(sample_dir / REFERENCE_INPUT, arrays, nhwc=("logits_index",))
            fed[i] = _info(arrays)
            return arrays

        bar = progress(desc=f"io {inputs.model}: {len(shapes)} samples on the CPU", unit="run")

        def ran(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        try:
            for i, outputs in iter_segmented(
                model_file, rt, model, len(shapes), sample, out_names, label=inputs.model, spill_dir=spill, on_run=ran
            ):
                seq_len, image_size = shapes[i]
                what = f"seq {seq_len}" if image_size is None else f"image size {image_size}"
                results = {n: to_numpy(outputs[n]) for n in out_names}
                del outputs
                for n, a in results.items():
                    if a.dtype.kind == "f" and not np.isfinite(a).all():
                        raise ModelDirError(f"{model_file}: output {n!r} has non-finite values at {what}")
                save_vars(testdir(tmp, seq_len) / REFERENCE_OUTPUT, results)
                samples.append(
                    IoSample(
                        seq_len=seq_len,
                        image_size=image_size,
                        dir=f"{TESTDIR}/{seq_len}",
                        inputs=fed.pop(i),
                        outputs=_info(results),
                    )
                )
                log.debug(
                    "io %s: %s -> %s", inputs.model, what, ", ".join(f"{n}{list(a.shape)}" for n, a in results.items())
                )
        except MNNFormatError as exc:  # MNN failed inside forward (it prints why, returns fewer outputs)
            named = "cannot run op" in str(exc)  # the op MNN refuses was found: the weight file is not in doubt
            raise ModelDirError(str(exc) if named else f"{exc}; is {weight_file} this model's weight file?") from None
        finally:
            bar.close()
        spill.rmdir()
        used = {part.model_file, part.weight_file, LLM_CONFIG}
        if fetched.speculation is not None and params.part == "llm":
            used.add(MODEL_CONFIG)  # its speculative_type and draft_predict_length chose the verify sample
        manifest = IoManifest(
            model=inputs.model,
            inputs=[r.under("model") for r in fetched.outputs if r.path in used],
            params=params,
            tools=tool_versions(mnn=True),
            outputs=record_outputs(tmp),
            samples=samples,
        )
        manifest.write(tmp)
    return manifest


def _lengths(spec: ModelSpec) -> str:
    return "/".join(str(n) for n in spec.prefill_lengths)


def io_params(spec: ModelSpec, at: At) -> IoParams:
    """The language model's samples: decode and one per prefill length; a VL encoder's: one per image size."""
    if at.part == VISUAL:
        return IoParams(
            part=VISUAL,
            visual_encoder=spec.visual_encoder,
            image_sizes=tuple(spec.image_sizes),
            seed=spec.seed,
        )
    return IoParams(chunk_sizes=spec.prefill_lengths, seed=spec.seed, prompt=spec.verify.prompt)


def describe(spec: ModelSpec, at: At) -> str:
    if at.part == VISUAL:
        sizes = "/".join(spec.image_sizes)
        return f"reference io of the {spec.name} visual encoder at image sizes {sizes} (MNN CPU)"
    return f"decode and prefill-{_lengths(spec)} reference io of {spec.name} (MNN CPU)"


STAGE = Stage(
    entry=generate_io,
    params_of=io_params,
    describe=describe,
    placement="part",
    defer=("*",),
    outputs=(TESTDIR,),
    tools=frozenset({"MNN"}),
    doc="Generate each model's decode/prefill reference inputs and outputs.",
)
