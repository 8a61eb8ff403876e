"""The committed VL and embedding test models take exactly the inputs docs/families.md and the spec describe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.cpu import CpuRuntime, load_module, to_numpy, to_var
from mnnbuild.model.spec import VISUAL_ENCODERS, ImageSize
from tests.conftest import FIXTURE_MODELS

VL_FIXTURES = {"qwen2.5-vl-tiny": "qwen2.5-vl", "qwen3-vl-tiny": "qwen3-vl"}
EMBEDDING_FIXTURE = FIXTURE_MODELS / "qwen3-embedding-tiny"


def _module(model_dir: Path, model_file: str) -> tuple[object, dict]:
    rt = CpuRuntime().create(model_dir / f"{model_file}.weight")
    module = load_module(model_dir / model_file, rt)
    return module, module.get_info()


def _hidden(model_dir: Path) -> int:
    return int(json.loads((model_dir / "llm_config.json").read_text())["hidden_size"])


def _encoder_feeds(kind: str, size: ImageSize) -> dict[str, np.ndarray]:
    """Inputs of the spec's shapes; content only has to be valid (indices in range)."""
    encoder = VISUAL_ENCODERS[kind]
    shapes = encoder.input_shapes(size)
    rng = np.random.default_rng(0)
    feeds = {}
    for name, shape in shapes.items():
        if name == "patches":
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
        elif name in ("attention_mask", "weight_tensor"):
            feeds[name] = np.full(shape, 0.25 if name == "weight_tensor" else 0.0, np.float32)
        elif name == "window_index":
            feeds[name] = np.arange(shape[0], dtype=np.int32)
        else:  # position_ids, idx_tensor: small valid indices
            feeds[name] = np.zeros(shape, np.int32)
    return feeds


@pytest.mark.parametrize("fixture", sorted(VL_FIXTURES))
def test_visual_encoder_takes_the_spec_shapes_at_every_size(fixture: str) -> None:
    kind = VL_FIXTURES[fixture]
    model_dir = FIXTURE_MODELS / fixture
    hidden = _hidden(model_dir)
    module, info = _module(model_dir, "visual.mnn")
    encoder = VISUAL_ENCODERS[kind]
    # The smallest image, and a non-square one: one graph per size, the shapes from the spec alone.
    sizes = [
        ImageSize(width=encoder.alignment, height=encoder.alignment),
        ImageSize(width=3 * encoder.alignment, height=2 * encoder.alignment),
    ]
    for size in sizes:
        feeds = _encoder_feeds(kind, size)
        assert info["inputNames"] == list(feeds)
        outputs = dict(zip(info["outputNames"], module.forward([to_var(feeds[n]) for n in feeds]), strict=True))
        tokens = size.patch_count(encoder) // encoder.merge_size**2
        embeds = to_numpy(outputs["image_embeds"])
        assert embeds.shape == (tokens, 1, hidden)
        assert np.isfinite(embeds).all()
        if kind == "qwen3-vl":
            assert to_numpy(outputs["deepstack_feature"]).shape == (3, tokens, hidden)
        else:
            assert set(outputs) == {"image_embeds"}


@pytest.mark.parametrize("fixture", sorted(VL_FIXTURES))
def test_vl_language_model_takes_mrope_positions(fixture: str) -> None:
    model_dir = FIXTURE_MODELS / fixture
    hidden, seq = _hidden(model_dir), 4
    module, info = _module(model_dir, "llm.mnn")
    declared = dict(zip(info["inputNames"], (list(i.shape) for i in info["inputs"]), strict=True))
    assert declared["position_ids"] == [3, -1]
    assert ("deepstack_embeds" in declared) == (VL_FIXTURES[fixture] == "qwen3-vl")
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), k=1).reshape(1, 1, seq, seq)
    feeds = {
        "input_ids": np.random.default_rng(1).standard_normal((seq, 1, hidden)).astype(np.float32) * 0.02,
        "attention_mask": mask,
        "position_ids": np.tile(np.arange(seq, dtype=np.int32), (3, 1)),
        "logits_index": np.array([-1], np.int32),
        "deepstack_embeds": np.zeros((3, seq, hidden), np.float32),
    }
    outputs = module.forward([to_var(feeds[n]) for n in info["inputNames"]])
    logits = to_numpy(dict(zip(info["outputNames"], outputs, strict=True))["logits"])
    assert logits.shape[:2] == (1, 1) and np.isfinite(logits).all()


def test_embedding_model_has_no_logits_index_and_returns_sentence_embeddings() -> None:
    config = json.loads((EMBEDDING_FIXTURE / "config.json").read_text())
    assert (config["llm_model"], config["llm_weight"]) == ("embedding.mnn", "embedding.mnn.weight")
    hidden, seq = _hidden(EMBEDDING_FIXTURE), 5
    module, info = _module(EMBEDDING_FIXTURE, "embedding.mnn")
    assert info["inputNames"] == ["input_ids", "attention_mask", "position_ids"]
    assert info["outputNames"] == ["sentence_embeddings"]
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), k=1).reshape(1, 1, seq, seq)
    feeds = [
        to_var(np.random.default_rng(2).standard_normal((seq, 1, hidden)).astype(np.float32) * 0.02),
        to_var(mask),
        to_var(np.arange(seq, dtype=np.int32).reshape(1, seq)),
    ]
    (embedding,) = module.forward(feeds)
    result = to_numpy(embedding)
    assert result.shape == (1, hidden) and np.isfinite(result).all()
