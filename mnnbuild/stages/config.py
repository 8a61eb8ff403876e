"""config: ``config_qnn.json``, the config the phone's ``llm_demo`` is started with.

As upstream's ``output_qnn`` writes it: the model's ``config.json`` with ``llm_model = "qnn/<model file>"``,
``llm_weight = "<weight file>"`` (always written), ``chunk_limits`` (every prefill length, then 1) and, for a VL
model, ``visual_model``; every other entry is kept as is. Ours besides: ``tokenizer_file`` when ``config.json``
does not name the tokenizer the bundle ships (upstream's model dir holds whatever it names), and the speculative
fields of the speculation the bundle was built for (:func:`speculative_entries`; lookahead's verify length joins
``chunk_limits``, since the engine pads its verify forward to one of them). Every file name the
result gives MNN's engine must stay inside the model dir (:func:`mnnbuild_runtime.bundle.check_config_files`),
so a ``config.json`` naming one elsewhere is refused here, before a bundle is made.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import ModelDirError
from mnnbuild.base.fsutil import atomic_write_text, staged_dir
from mnnbuild.manifests.config import ConfigInputs, ConfigManifest, ConfigParams, ConfigQnn
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.mnn.llm import (
    DEFAULT_TOKENIZER,
    DRAFT_LENGTH_FIELD,
    EAGLE,
    EAGLE_TREE_DEFAULTS,
    LOOKAHEAD,
    LOOKAHEAD_DEFAULTS,
    MODEL_CONFIG,
    SPECULATIVE_TYPE,
)
from mnnbuild.model.modeldir import LLM_CONFIG, VISUAL_PART, ModelPart, read_model_config, tokenizer_file
from mnnbuild.model.spec import ModelSpec
from mnnbuild.model.speculation import Speculation, model_lookahead_settings
from mnnbuild.pipeline.layout import CONFIG_FILE
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage

log = logging.getLogger(__name__)


def speculative_entries(
    speculation: Speculation | None, model_config: dict[str, Any], lookahead: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The engine's speculative fields for ``speculation``, written out (the model's own values kept where it has
    them, the engine's defaults otherwise) so that what the engine runs and what the graphs were compiled for
    agree: ``speculative_type``, ``draft_predict_length``, Eagle's ``hidden_states`` and draft file names, or
    lookahead's settings (``lookahead``: as :func:`~mnnbuild.model.speculation.model_lookahead_settings` read them,
    ``llm_config.json``'s winning, so the bundle says what the engine runs)."""
    if speculation is None:
        return {}
    entries: dict[str, Any] = {
        SPECULATIVE_TYPE: speculation.kind,
        DRAFT_LENGTH_FIELD: speculation.draft_predict_length,
        **speculation.names,
    }
    if speculation.kind == EAGLE:
        entries["hidden_states"] = True
        entries.update({k: model_config.get(k, v) for k, v in EAGLE_TREE_DEFAULTS.items()})
    else:
        got = lookahead if lookahead is not None else {**LOOKAHEAD_DEFAULTS, **model_config}
        entries.update({k: got[k] for k in LOOKAHEAD_DEFAULTS})
    return entries


def chunk_limits(prefill: tuple[int, ...], speculation: Speculation | None) -> list[int]:
    """Every prefill length, (lookahead, or no decode graph) its verify length, then 1 unless the bundle has no
    decode graph: the lengths the engine plans a forward at."""
    if speculation is not None and speculation.in_chunk_limits:
        prefill = tuple(sorted(speculation.graph_lengths(prefill), reverse=True))
    return [*prefill] if speculation is not None and not speculation.decode_graph else [*prefill, 1]


def qnn_config(
    model_config: dict[str, Any],
    part: ModelPart,
    params: ConfigParams,
    tokenizer: str,
    speculation: Speculation | None = None,
    lookahead: dict[str, Any] | None = None,
) -> ConfigQnn:
    """``config.json``'s entries with upstream's set (and the shipped tokenizer named when it is not already); the
    speculative fields as the bundle was built for them (none: a ``speculative_type`` the spec turned off is
    dropped, so the engine does not speculate without the graph it needs)."""
    entries = dict(model_config)
    limits = chunk_limits(params.chunk_sizes, speculation)
    entries.update(llm_model=part.result_model, llm_weight=part.weight_file, chunk_limits=limits)
    if speculation is None:
        entries.pop(SPECULATIVE_TYPE, None)
    entries.update(speculative_entries(speculation, model_config, lookahead))
    if params.visual_model is not None:
        entries["visual_model"] = params.visual_model
    if entries.get("tokenizer_file", DEFAULT_TOKENIZER) != tokenizer:
        entries["tokenizer_file"] = tokenizer
    return ConfigQnn.model_validate(entries)


def write_config(inputs: ConfigInputs, params: ConfigParams, out_dir: Path) -> ConfigManifest:
    """Write ``config_qnn.json`` from the fetched model's ``config.json`` (see the module docstring)."""
    # what MNN's engine may read, and what llm_config.json may not override: one rule each, the runtime's
    from mnnbuild_runtime.bundle import check_config_files, check_llm_config
    from mnnbuild_runtime.errors import BundleError

    fetched = inputs.manifest(FetchManifest, inputs.model_dir)
    tokenizer = tokenizer_file(inputs.model_dir)
    speculation = fetched.speculation
    looks = speculation is not None and speculation.kind == LOOKAHEAD
    lookahead = model_lookahead_settings(inputs.model_dir)[0] if looks else None
    config = qnn_config(read_model_config(inputs.model_dir), fetched.part, params, tokenizer, speculation, lookahead)
    check_config_files(Path(inputs.model_dir) / MODEL_CONFIG, config.model_dump(), links=True)  # fetched: links
    try:  # the model's llm_config.json ships with the bundle (the partition rewrites only its tie_embeddings)
        check_llm_config(Path(inputs.model_dir) / CONFIG_FILE, config.model_dump(), links=True)
    except BundleError as exc:
        raise ModelDirError(str(exc)) from None
    read = (LLM_CONFIG,)  # checked above; its lookahead settings win over config.json's in the engine
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / CONFIG_FILE, config.to_json())
        manifest = ConfigManifest(
            model=inputs.model,
            target=inputs.target,
            inputs=[r.under("model") for r in fetched.outputs if r.path in (MODEL_CONFIG, tokenizer, *read)],
            params=params,
            tools=tool_versions(),
            outputs=record_outputs(tmp),
            config=config,
        )
        manifest.write(tmp)
    log.debug(
        "config %s-%s: %s, chunk_limits %s, tokenizer %s",
        inputs.model, inputs.target, config.llm_model, config.chunk_limits, tokenizer,
    )  # fmt: skip
    return manifest


def config_params(spec: ModelSpec, at: At) -> ConfigParams:
    return ConfigParams(
        chunk_sizes=spec.prefill_lengths,
        visual_model=VISUAL_PART.result_model if spec.family == "vl" else None,
    )


def describe(spec: ModelSpec, at: At) -> str:
    limits = [*spec.prefill_lengths, 1] if spec.decode_graph else f"{list(spec.prefill_lengths)} + the verify length"
    return f"config_qnn.json for {spec.name} on {at.arch} (chunk limits {limits})"


STAGE = Stage(
    entry=write_config,
    params_of=config_params,
    describe=describe,
    placement="target",
    outputs=(CONFIG_FILE,),
    doc="`config_qnn.json` per target: the model's `config.json` with the entries upstream's `output_qnn` sets.",
)
