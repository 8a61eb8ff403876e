"""The benchmark shape presets (issue 44) give the released models' dims; nothing is exported here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models" / "export"))
import make_models  # noqa: E402  (imports no torch)

# From each model's Hugging Face config.json: layers, hidden, intermediate, heads, KV heads, head_dim, vocab, tied.
RELEASED = {
    "qwen3-1.7b": (28, 2048, 6144, 16, 8, 128, 151936, True),
    "qwen3-4b": (36, 2560, 9728, 32, 8, 128, 151936, True),
    "qwen3-8b": (36, 4096, 12288, 32, 8, 128, 151936, False),
}


@pytest.mark.parametrize("shape", sorted(RELEASED))
def test_shape_spec_has_released_dims(shape: str) -> None:
    layers, hidden, inter, heads, kv, head_dim, vocab, tied = RELEASED[shape]
    spec = make_models.qwen3_spec(shape, 3)
    got = (spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads, spec.head_dim)
    assert got == (hidden, inter, heads, kv, head_dim)
    assert (spec.vocab_size, spec.tie_embeddings, spec.num_layers) == (vocab, tied, 3)
    assert (spec.quant_bit, spec.quant_block, spec.symmetric) == (4, 64, False)  # llmexport's int4 default
    assert make_models.QWEN3_SHAPES[shape].num_layers == layers
    assert spec.name == f"{shape}-L3"
    with pytest.raises(ValueError, match=f"1..{layers}"):
        make_models.qwen3_spec(shape, layers + 1)


def test_default_shape_is_the_old_1_7b_spec() -> None:
    assert make_models.DEFAULT_SHAPE == "qwen3-1.7b"
    assert make_models.qwen3_1_7b_spec(28) == make_models.qwen3_spec("qwen3-1.7b", 28)


def test_shape_flag_reaches_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--shape qwen3-8b --qwen3-1.7b-layers 2`` builds the 8B spec (the export itself replaced by a recorder)."""
    made = []
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # main() sets them: restored after the test
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(make_models, "train_tokenizer", lambda seed, vocab: None)
    monkeypatch.setattr(make_models, "make_model", lambda spec, *a, **k: made.append(spec))
    argv = ["--shape", "qwen3-8b", "--qwen3-1.7b-layers", "2", "--out", str(tmp_path / "m")]
    assert make_models.main(argv) == 0
    assert [(s.name, s.hidden_size, s.tie_embeddings) for s in made] == [("qwen3-8b-L2", 4096, False)]
    with pytest.raises(SystemExit):  # 37 layers: more than Qwen3-8B has
        make_models.main(["--shape", "qwen3-8b", "--qwen3-1.7b-layers", "37", "--out", str(tmp_path / "m")])


def test_repeat_from_exports_k_layers_and_repeats_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--qwen3-1.7b-layers 36 --repeat-from 2``: the 2-layer spec is exported, then repeated to 36 layers into
    ``--out`` with a note of how it was exported (export and repetition replaced by recorders)."""
    import repeat_layers

    exported, repeated = [], []
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(make_models, "train_tokenizer", lambda seed, vocab: None)
    monkeypatch.setattr(make_models, "make_model", lambda spec, *a, out, **k: exported.append((spec, out)))
    monkeypatch.setattr(repeat_layers, "repeat_dir", lambda src, dest, n, made: repeated.append((src, dest, n, made)))
    out = tmp_path / "m"
    argv = ["--shape", "qwen3-8b", "--qwen3-1.7b-layers", "36", "--repeat-from", "2", "--out", str(out)]
    assert make_models.main(argv) == 0
    ((spec, source),) = exported
    assert (spec.name, spec.num_layers, spec.hidden_size) == ("qwen3-8b-L2", 2, 4096)
    assert repeated == [(source, out, 36, repeated[0][3])]
    assert (repeated[0][3]["shape"], repeated[0][3]["exported_layers"]) == ("qwen3-8b", 2)
    assert not source.parent.exists()  # the K-layer export is scratch
    for bad in (["--repeat-from", "1"], ["--repeat-from", "37"]):
        with pytest.raises(SystemExit):
            make_models.main(["--shape", "qwen3-8b", "--qwen3-1.7b-layers", "36", *bad, "--out", str(out)])
