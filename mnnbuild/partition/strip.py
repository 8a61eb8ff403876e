"""The weight file a bundle ships: only what the phone reads of the model's.

Once the plugins compute the layers, the CPU ops of ``qnn/llm.mnn`` read little of ``llm.mnn.weight`` (at most a
convolution or norm kept on the CPU), and MNN's LLM engine reads the tied embeddings (``llm_config.json``
``tie_embeddings``, the lm_head's codes and scales). The partition writes those bytes alone (`mnnbuild.mnn.strip`),
the partitioned model and ``llm_config.json`` pointing at them, beside each other as the bundle ships them. An
untied model's embeddings are ``embeddings_bf16.bin``, which the bundle ships as it is; its weight file may then be
empty, which MNN's engine accepts (it only checks that the file exists). The model dir is only read.
"""

from __future__ import annotations

import json
from pathlib import Path

from mnnbuild.base.errors import MNNFormatError, StageError
from mnnbuild.base.fsutil import atomic_write_bytes, atomic_write_text
from mnnbuild.manifests.partition import KeptBytes, ShippedWeights
from mnnbuild.mnn import MnnModel, external_ranges, plan_weights, relocate_model, tie_embeddings, write_weights
from mnnbuild.mnn.weights import WeightRange
from mnnbuild.model.modeldir import LLM_CONFIG, ModelPart, read_llm_config


def _union_bytes(ranges: list[WeightRange]) -> int:
    total, end = 0, -1
    for r in sorted(ranges, key=lambda r: r.offset):
        start = max(r.offset, end)
        if r.end > start:
            total += r.end - start
        end = max(end, r.end)
    return total


def strip_weights(result: MnnModel, model_dir: Path, part: ModelPart, out_dir: Path) -> tuple[MnnModel, ShippedWeights]:
    """Write the shipped weight file of ``result`` (the partitioned ``part`` of ``model_dir``) to ``out_dir`` and, for
    the model's own graph, ``llm_config.json``; returns ``result`` pointing into that file, and what was kept."""
    weight_path = Path(model_dir) / part.weight_file
    config_path = Path(model_dir) / LLM_CONFIG
    try:
        ranges = external_ranges(result)
        config = None if part.family == "visual" else read_llm_config(Path(model_dir))
        tie = tie_embeddings(config, config_path) if config is not None else None
        tie_range = tie.weight_range() if tie is not None else None
        extra = [tie_range] if tie_range is not None else []
        plan = plan_weights(weight_path, ranges + extra, never_at_zero=[r.offset for r in extra])
    except MNNFormatError as exc:
        raise StageError(str(exc)) from None
    write_weights(plan, Path(out_dir) / part.shipped_weight_file)
    if config is not None:
        if tie is not None and tie_range is not None:
            moved = tie.moved(config, plan.moved(tie_range.offset, tie_range.size))
            atomic_write_text(Path(out_dir) / LLM_CONFIG, json.dumps(moved, indent=4, ensure_ascii=False) + "\n")
        else:  # nothing in it moves: the model's file as it is
            atomic_write_bytes(Path(out_dir) / LLM_CONFIG, config_path.read_bytes())
    shipped = ShippedWeights(
        file=part.shipped_weight_file,
        source_bytes=plan.source_size,
        bytes=plan.size,
        cpu_op_bytes=_union_bytes(ranges),
        tie_embedding_bytes=tie_range.size if tie_range is not None else 0,
        blocks=[KeptBytes(source_offset=b.source_offset, offset=b.offset, size=b.size) for b in plan.blocks],
        llm_config=LLM_CONFIG if config is not None else None,
    )
    return relocate_model(result, plan), shipped
