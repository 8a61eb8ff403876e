"""io: the reference input/output samples of the whole graph (upstream ``generateLlmIO``).

For the decode shape (1 token) and every prefill length (``chunk_sizes``, longest first) it writes
``testdir/<seq>/input.mnn`` and ``testdir/<seq>/output.mnn``: seeded random embeddings in
``input_ids`` ``[seq,1,hidden]``, a float causal mask ``[1,1,seq,seq]`` (lowest float above the
diagonal; for a model mixing full and sliding-window layers, ``llm_config.json``'s ``attention_type`` ``"mix"``, the
two-part ``[2,1,1,seq,seq]`` mask MNN's engine builds, the second part also hiding keys ``sliding_window`` or more
rows back), ``position_ids`` ``[1,seq]`` and, for a text LLM, ``logits_index`` ``[1]`` (0 for prefill,
-1 for decode), and the model's outputs for them, computed by PyPI MNN on the CPU. A speculative build (the fetch
manifest's ``speculation``) also gets a sample at the verify length, ``draft_predict_length + 1`` tokens with
``logits_index`` 0, as MNN's engine checks a draft; an Eagle target's outputs include ``hidden_states``. MNN's engine
also runs a prefill block the prompt fills whole unpadded with ``logits_index`` -1 (the last row only): each such
block length gets a sample of that feed too, ``testdir/<seq>-last`` (the manifest's ``whole_block_samples``), no graph
of its own; verify proves the graphs built serve it. Which graph
and which inputs come from the model part the fetch stage recorded (``mnnbuild.model.modeldir.ModelPart``).

A VL language model (M-RoPE) takes ``position_ids`` ``[3,seq]`` with a stand-in image in the prefill samples,
and Qwen3-VL's also ``deepstack_embeds`` ``[3,seq,hidden]`` (docs/families.md section 3.1); the inputs fed are the
model's own. A VL model's encoder (``visual.mnn``, the ``visual`` chain) gets one sample per image size,
``testdir/<patches>``, its inputs built by ``mnnbuild.model.visual`` (section 3.2).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mnnbuild.base.child import Child
from mnnbuild.base.errors import ChildDiedError, MNNFormatError, ModelDirError
from mnnbuild.base.fsutil import staged_dir
from mnnbuild.base.logs import progress
from mnnbuild.cpu import save_vars, to_numpy
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import DECODE_SEQ, IoInputs, IoManifest, IoParams, IoSample, TensorInfo
from mnnbuild.mnn.llm import MODEL_CONFIG, attention_window
from mnnbuild.model.modeldir import (
    LLM_CONFIG,
    chain_part,
    check_hidden_size,
    read_llm_config,
)
from mnnbuild.model.spec import VISUAL, VISUAL_ENCODERS, ImageSize, ModelSpec
from mnnbuild.pipeline.layout import REFERENCE_INPUT, REFERENCE_OUTPUT, TESTDIR, testdir
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage
from mnnbuild.samples.inputs import LAST_ROW, Feed, make_inputs, whole_blocks

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

MNN_IN_CHILD = True
"""Run MNN in a spawned child (see :func:`generate_io`); tests that watch io's steps in this process set it off."""


def _info(arrays: dict[str, np.ndarray]) -> list[TensorInfo]:
    return [TensorInfo(name=n, shape=list(a.shape), dtype=str(a.dtype)) for n, a in arrays.items()]


def generate_io(inputs: IoInputs, params: IoParams, out_dir: Path) -> IoManifest:
    """Run the whole graph on each sample (a language model: decode and every prefill length; a VL encoder: every
    image size) and save inputs and outputs. Samples are made one at a time and written as soon as MNN computed
    them (:func:`~mnnbuild.cpu.segments.iter_segmented`): memory follows the largest sample, not their sum.

    MNN runs the user's model in a spawned child: a malformed model (an op without the parameters its type needs)
    crashes MNN itself (SIGSEGV), which here is one line naming the model file, not the end of doit with none."""
    with staged_dir(out_dir) as tmp:
        if not MNN_IN_CHILD:
            return _generate_io(None, inputs, params, tmp)
        # spawned: nothing of this process (QNN contexts, threads) is forked into MNN's
        with Child(multiprocessing.get_context("spawn"), _generate_io, (inputs, params, tmp), "io") as child:
            try:
                return child.result()
            except ChildDiedError:
                code = child.process.exitcode or 0
                if code >= 0 or -code in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                    raise  # ended, killed or stopped from outside (the OOM killer, Ctrl-C): not the model's fault
                model = _model_file(inputs, params)
                raise ModelDirError(
                    f"{model}: MNN crashed ({signal.Signals(-code).name}) running the model on the CPU: the file is "
                    f"malformed (e.g. an op without the parameters its type needs); `python -m mnnbuild inspect "
                    f"{model}` lists its ops"
                ) from None


def _model_file(inputs: IoInputs, params: IoParams) -> Path:
    model_dir = Path(inputs.model_dir)
    return model_dir / chain_part(inputs.manifest(FetchManifest, model_dir).part, params.part).model_file


def _generate_io(_channel: object, inputs: IoInputs, params: IoParams, tmp: Path) -> IoManifest:
    """:func:`generate_io`'s work in its child, written into the staged directory ``tmp``."""
    import numpy as np

    from mnnbuild.cpu.segments import iter_segmented
    from mnnbuild.mnn import load_model
    from mnnbuild.samples.checks import (
        check_mask,
        check_model_bounds,
        check_prompt_fits,
        check_verify_length,
        visual_feed,
        warn_zero_epsilon,
    )

    model_dir = Path(inputs.model_dir)
    fetched = inputs.manifest(FetchManifest, model_dir)
    part = chain_part(fetched.part, params.part)
    config = read_llm_config(model_dir)
    model_file, weight_file = model_dir / part.model_file, model_dir / part.weight_file
    try:
        model = load_model(model_file)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    check_model_bounds(params, config, model_dir / LLM_CONFIG)
    names, out_names = list(model.input_names), list(model.output_names)
    feed: Callable[[int], Feed]
    if part.family == "visual":
        feed = visual_feed(params, model, model_file, config)
        encoder = VISUAL_ENCODERS[str(params.visual_encoder)]
        shapes = [(ImageSize.parse(t).patch_count(encoder), t) for t in params.image_sizes]
        last_row = [False] * len(shapes)
    else:
        check_mask(part, model, model_file, config)
        warn_zero_epsilon(model, model_file)
        check_hidden_size(config, model, model_dir, part.model_file)  # fetch checked the source; this, what io reads
        if part.generates:
            check_prompt_fits(inputs, params, model_dir)
        unknown = sorted(set(names) - set(part.inputs))
        if unknown:
            kind = "LLM" if part.family == "llm" else part.family
            raise ModelDirError(
                f"{model_file}: graph input {unknown[0]!r} is not an {kind} input; "
                f"expected inputs among {', '.join(part.inputs)}"
            )
        lengths = (DECODE_SEQ, *params.chunk_sizes)
        blocks = params.chunk_sizes  # chunk_limits above decode: the prefill blocks the engine plans
        if fetched.speculation is not None:
            check_verify_length(fetched.speculation.verify_length, params, model_dir)
            lengths = fetched.speculation.graph_lengths(lengths, decode=DECODE_SEQ)
            if fetched.speculation.in_chunk_limits:
                blocks = fetched.speculation.graph_lengths(blocks)
        shapes = [(seq_len, None) for seq_len in lengths]
        whole = whole_blocks(blocks, names)
        last_row = [False] * len(shapes) + [True] * len(whole)
        shapes += [(seq_len, None) for seq_len in whole]
        declared, hidden = model.input_dims, config["hidden_size"]
        window = attention_window(config) if part.mask_from_llm_config else None

        def llm_feed(i: int) -> Feed:
            return make_inputs(shapes[i][0], hidden, params.seed, declared, window, LAST_ROW if last_row[i] else None)

        feed = llm_feed
    rt = params.runtime.create(weight_file)
    samples: list[IoSample] = []
    whole_block_samples: list[IoSample] = []
    spill = tmp / ".spill"
    spill.mkdir()
    fed: dict[int, list[TensorInfo]] = {}

    def sample(i: int) -> Feed:
        """Sample ``i``'s inputs, written to its testdir as they are made."""
        arrays = {n: a for n, a in feed(i).items() if n in names}
        arrays = {n: arrays[n] for n in names}
        sample_dir = testdir(tmp, shapes[i][0], last_row[i])
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
            sample_dir = testdir(tmp, seq_len, last_row[i])
            save_vars(sample_dir / REFERENCE_OUTPUT, results)
            (whole_block_samples if last_row[i] else samples).append(
                IoSample(
                    seq_len=seq_len,
                    image_size=image_size,
                    dir=sample_dir.relative_to(tmp).as_posix(),
                    inputs=fed.pop(i),
                    outputs=_info(results),
                    logits_index=LAST_ROW if last_row[i] else None,
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
        whole_block_samples=whole_block_samples,
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
    doc=(
        "Reference samples of the whole graph, decode and each prefill length (and a speculative bundle's "
        "verify length), by MNN on the CPU; each prefill length also as the engine feeds a chunk the prompt fills "
        "whole (the last row's logits only)."
    ),
    mirrors="generateLlmIO",
)
