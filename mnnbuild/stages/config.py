"""config: ``config_qnn.json``, the config the phone's ``llm_demo`` is started with.

As upstream's ``output_qnn`` writes it: the model's ``config.json`` with ``llm_model = "qnn/<model file>"``,
``llm_weight = "<weight file>"`` (always written), ``chunk_limits`` (every prefill length, then 1) and, for a VL
model, ``visual_model``; every other entry is kept as is. Ours besides: ``tokenizer_file`` when ``config.json``
does not name the tokenizer the bundle ships (upstream's model dir holds whatever it names). Every file name the
result gives MNN's engine must stay inside the model dir (:func:`mnnbuild_runtime.bundle.check_config_files`),
so a ``config.json`` naming one elsewhere is refused here, before a bundle is made.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mnnbuild.base.fsutil import atomic_write_text, staged_dir
from mnnbuild.manifests.config import ConfigInputs, ConfigManifest, ConfigParams, ConfigQnn
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.model.modeldir import MODEL_CONFIG, ModelPart, read_model_config, tokenizer_file
from mnnbuild.pipeline.layout import CONFIG_FILE, DEFAULT_TOKENIZER
from mnnbuild.pipeline.manifest import FileRecord, record_outputs, tool_versions
from mnnbuild.pipeline.stage import Stage

log = logging.getLogger(__name__)


def qnn_config(
    model_config: dict[str, Any],
    part: ModelPart,
    params: ConfigParams,
    tokenizer: str,
) -> ConfigQnn:
    """``config.json``'s entries with upstream's set (and the shipped tokenizer named when it is not already)."""
    entries = dict(model_config)
    entries.update(llm_model=part.result_model, llm_weight=part.weight_file, chunk_limits=[*params.chunk_sizes, 1])
    if params.visual_model is not None:
        entries["visual_model"] = params.visual_model
    if entries.get("tokenizer_file", DEFAULT_TOKENIZER) != tokenizer:
        entries["tokenizer_file"] = tokenizer
    return ConfigQnn.model_validate(entries)


def write_config(inputs: ConfigInputs, params: ConfigParams, out_dir: Path) -> ConfigManifest:
    """Write ``config_qnn.json`` from the fetched model's ``config.json`` (see the module docstring)."""
    from mnnbuild_runtime.bundle import check_config_files  # what MNN's engine may read: one rule, the runtime's

    fetched = inputs.manifest(FetchManifest, inputs.model_dir)
    tokenizer = tokenizer_file(inputs.model_dir)
    config = qnn_config(read_model_config(inputs.model_dir), fetched.part, params, tokenizer)
    check_config_files(Path(inputs.model_dir) / MODEL_CONFIG, config.model_dump(), links=True)  # fetched: links
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / CONFIG_FILE, config.to_json())
        manifest = ConfigManifest(
            model=inputs.model,
            target=inputs.target,
            inputs=[
                FileRecord(path=f"model/{r.path}", size=r.size, sha256=r.sha256)
                for r in fetched.outputs
                if r.path in (MODEL_CONFIG, tokenizer)
            ],
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


STAGE = Stage(
    name="config",
    entry=write_config,
    inputs=ConfigInputs,
    params=ConfigParams,
    manifest=ConfigManifest,
    upstream=("fetch",),
    outputs=(CONFIG_FILE,),
    per_target=True,
    doc="Write each model's config_qnn.json per target.",
)
