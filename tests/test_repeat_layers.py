"""models/export/repeat_layers.py: the shipped 2-layer tiny model repeated to 4 layers runs in MNN's CPU runtime, each
added layer is the exported layer 1 (its weight bytes, and its computation on the residual before it), and the
final norm, lm_head and tied embeddings are the source's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.mnn import WeightFile, external_tables, load_model, read_embeddings
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR

sys.path.insert(0, str(PROJECT_ROOT / "models" / "export"))
import repeat_layers  # noqa: E402  (mnnbuild only, no torch)

TOKENS = [10, 200, 300, 400, 500, 600, 700]
LAYERS = 4


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("repeat") / "tiny-qwen3-L4"
    assert repeat_layers.main([str(TINY_MODEL_DIR), "--layers", str(LAYERS), "--out", str(dest)]) == 0
    return dest


def _layer_ops(model_path: Path, layer: int) -> list:
    model = load_model(model_path)
    return [op for op in model.ops if repeat_layers.op_layer(op) == layer]


def _stored(weights: WeightFile, op) -> list[bytes]:
    out = []
    for table in external_tables(op.main):
        ext = [int(v) for v in table.external]
        out.append(weights.read(ext[0], sum(ext[1:]), op.name).tobytes())
    return out


def test_note_config_and_graph(repeated: Path) -> None:
    note = json.loads((repeated / repeat_layers.NOTE_FILE).read_text())
    assert (note["exported_layers"], note["layers"], note["layer_sources"]) == (2, LAYERS, [0, 1, 1, 1])
    assert note["source"]["dir_name"] == TINY_MODEL_DIR.name
    model = load_model(repeated / "llm.mnn")
    attention = [op for op in model.ops if op.type == "Attention"]
    assert [int(op.main.layerIndex) for op in attention] == list(range(LAYERS))
    assert len(set(model.tensor_names)) == len(model.tensor_names)
    source = load_model(TINY_MODEL_DIR / "llm.mnn")
    assert model.mnn_uuid != source.mnn_uuid
    per_layer = len(_layer_ops(TINY_MODEL_DIR / "llm.mnn", 1))
    assert [len(_layer_ops(repeated / "llm.mnn", i)) for i in (2, 3)] == [per_layer, per_layer]
    weight_size = (repeated / "llm.mnn.weight").stat().st_size
    assert weight_size == note["weight_file_bytes"] > (TINY_MODEL_DIR / "llm.mnn.weight").stat().st_size
    for name in ("config.json", "tokenizer.mtok"):
        assert (repeated / name).read_bytes() == (TINY_MODEL_DIR / name).read_bytes()


def test_layer_weights_are_the_source_layers(repeated: Path) -> None:
    """Each layer's ops read, at offsets of their own, exactly the bytes the source layer they copy reads; the ops
    after the layers (final norm, lm_head) and the tied embeddings read the source's bytes."""
    note = json.loads((repeated / repeat_layers.NOTE_FILE).read_text())
    with WeightFile(repeated / "llm.mnn.weight") as new, WeightFile(TINY_MODEL_DIR / "llm.mnn.weight") as old:
        offsets: list[int] = []
        for layer, source in enumerate(note["layer_sources"]):
            ops, src_ops = _layer_ops(repeated / "llm.mnn", layer), _layer_ops(TINY_MODEL_DIR / "llm.mnn", source)
            assert [op.type for op in ops] == [op.type for op in src_ops]
            for op, src in zip(ops, src_ops, strict=True):
                if op.main is None:
                    continue
                assert _stored(new, op) == _stored(old, src)
                offsets += [int(t.external[0]) for t in external_tables(op.main)]
        assert len(set(offsets)) == len(offsets)  # every layer's copy at offsets of its own
        tail = load_model(repeated / "llm.mnn").ops[-5:]
        src_tail = load_model(TINY_MODEL_DIR / "llm.mnn").ops[-5:]
        assert [op.name for op in tail] == [op.name for op in src_tail]
        assert [b for op in tail for b in _stored(new, op)] == [b for op in src_tail for b in _stored(old, op)]
    np.testing.assert_array_equal(read_embeddings(repeated, TOKENS), read_embeddings(TINY_MODEL_DIR, TOKENS))


def _feeds(seq: int, hidden: int, x: np.ndarray) -> dict:
    import MNN.expr as F

    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), k=1).reshape(1, 1, seq, seq)
    return {
        "input_ids": F.const(x, [seq, 1, hidden], F.NCHW, F.float),
        "attention_mask": F.const(mask, [1, 1, seq, seq], F.NCHW, F.float),
        "position_ids": F.const(np.arange(seq, dtype=np.int32).reshape(1, seq), [1, seq], F.NCHW, F.int),
        "logits_index": F.const(np.array([-1], np.int32), [1], F.NCHW, F.int),
    }


def _run(model_dir: Path, inputs: list[str], outputs: list[str], feeds: dict) -> list[np.ndarray]:
    import MNN.nn as nn  # never MNN.tools

    rt = nn.create_runtime_manager(({"backend": "CPU", "precision": "high", "numThread": 1},))
    rt.set_external(str(model_dir / "llm.mnn.weight"))
    module = nn.load_module_from_file(str(model_dir / "llm.mnn"), inputs, outputs, runtime_manager=rt)
    outs = module.forward([feeds[n] for n in inputs])
    return [np.array(o.read(), np.float32).reshape(o.shape) for o in outs]


def test_mnn_runs_it_and_each_added_layer_is_layer_1(repeated: Path) -> None:
    """MNN's CPU runtime: logits [1, 1, vocab], finite, not the 2-layer model's; the residual after layer i (2, 3)
    equals the source model's layer 1 run on the residual after layer i - 1 (fed in its place), bit for bit."""
    import MNN.expr as F

    hidden = json.loads((TINY_MODEL_DIR / "llm_config.json").read_text())["hidden_size"]
    seq = len(TOKENS)
    x = read_embeddings(TINY_MODEL_DIR, TOKENS).reshape(seq, 1, hidden).astype(np.float32)
    feeds = _feeds(seq, hidden, x)
    graph_inputs = ["input_ids", "attention_mask", "position_ids", "logits_index"]
    (logits,) = _run(repeated, graph_inputs, ["logits"], feeds)
    (source_logits,) = _run(TINY_MODEL_DIR, graph_inputs, ["logits"], feeds)
    assert logits.shape == source_logits.shape == (1, 1, 1024)
    assert np.isfinite(logits).all() and np.abs(logits - source_logits).max() > 1e-3

    residuals = _run(repeated, graph_inputs[:3], [f"/blocks.{i}/Add_1_output_0" for i in range(LAYERS)], feeds)
    into_layer_1 = "/blocks.0/Add_1_output_0"
    for layer in (2, 3):
        before = residuals[layer - 1]
        fed = {**feeds, into_layer_1: F.const(before, list(before.shape), F.NCHW, F.float)}
        (again,) = _run(
            TINY_MODEL_DIR, ["input_ids", into_layer_1, *graph_inputs[1:3]], ["/blocks.1/Add_1_output_0"], fed
        )
        np.testing.assert_array_equal(residuals[layer], again)
        assert np.abs(residuals[layer] - before).max() > 1e-3  # the layer does something


def test_mnn_llm_generates_with_each_layers_kv_cache(repeated: Path) -> None:
    """MNN.llm loads the 4-layer dir; its prefill logits are the module's, and the 6 tokens it decodes greedily (each
    step through the 4 Attention ops' KV caches, kept per layerIndex) are those of a whole prefill per step."""
    import MNN.llm  # never MNN.tools

    hidden = json.loads((repeated / "llm_config.json").read_text())["hidden_size"]
    llm = MNN.llm.create(str(repeated / "config.json"))
    llm.set_config({"sampler_type": "greedy", "max_new_tokens": 6, "use_template": False, "precision": "high",
                    "memory": "high"})  # fmt: skip
    llm.load()
    prompt = "The quick brown fox"
    ids = list(llm.tokenizer_encode(prompt))
    engine = np.array(llm.forward(ids).read(), np.float32).reshape(-1)[-1024:]

    def module_logits(tokens: list[int]) -> np.ndarray:
        x = read_embeddings(repeated, tokens).reshape(len(tokens), 1, hidden).astype(np.float32)
        feeds = _feeds(len(tokens), hidden, x)
        names = ["input_ids", "attention_mask", "position_ids", "logits_index"]
        return _run(repeated, names, ["logits"], feeds)[0].reshape(-1)

    assert np.abs(engine - module_logits(ids)).max() < 1e-3
    llm.reset()
    llm.response(prompt)
    generated = list(llm.context.output_tokens)[-6:]
    assert llm.context.gen_seq_len == 6
    tokens = list(ids)
    for _ in range(6):
        tokens.append(int(np.argmax(module_logits(tokens))))
    assert generated == tokens[len(ids) :]


def test_refuses_what_it_cannot_repeat(tmp_path: Path) -> None:
    with pytest.raises(repeat_layers.RepeatError, match="fewer than the 2 exported layers"):
        repeat_layers.repeat_dir(TINY_MODEL_DIR, tmp_path / "x", 1)
    with pytest.raises(SystemExit, match="repeat_layers: .*fewer than"):
        repeat_layers.main([str(TINY_MODEL_DIR), "--layers", "1", "--out", str(tmp_path / "y")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_out_replaces_only_a_model_directory(repeated: Path, tmp_path: Path) -> None:
    """--out replaces its directory as a whole: a directory of someone's files is refused in one line before any
    work and left as it was; an earlier model directory is replaced."""
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "notes.txt").write_text("mine")
    for dest, why in ((home, "holds projects/"), (loose, "holds none of"), (home / "notes.txt", "not a directory")):
        with pytest.raises(SystemExit, match=f"repeat_layers: {dest}: .*{why}") as caught:
            repeat_layers.main([str(TINY_MODEL_DIR), "--layers", str(LAYERS), "--out", str(dest)])
        assert "\n" not in str(caught.value)
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "projects"]
    assert (loose / "notes.txt").read_text() == "mine" and len(list(tmp_path.glob(".*"))) == 0
    again = tmp_path / "again"
    assert repeat_layers.main([str(TINY_MODEL_DIR), "--layers", "3", "--out", str(again)]) == 0
    assert repeat_layers.main([str(TINY_MODEL_DIR), "--layers", str(LAYERS), "--out", str(again)]) == 0
    assert (again / "llm.mnn.weight").read_bytes() == (repeated / "llm.mnn.weight").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "home", "loose"]


def test_the_source_is_never_the_out_and_layers_are_bounded(tmp_path: Path) -> None:
    """``--out SRC`` passed the model-directory check and replaced the exported model with its repeat (the export
    lost); ``--layers 100000000`` ran for minutes building a graph no file could hold."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "tokenizer.mtok"):
        (src / name).write_bytes((TINY_MODEL_DIR / name).read_bytes())
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    for out in (src, tmp_path / "." / "src"):
        with pytest.raises(SystemExit, match=f"repeat_layers: --out {out}: is the source model"):
            repeat_layers.main([str(src), "--layers", "3", "--out", str(out)])
    with pytest.raises(SystemExit, match="repeat_layers: --layers 100000000: more than 1024"):
        repeat_layers.main([str(src), "--layers", "100000000", "--out", str(tmp_path / "new")])
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
