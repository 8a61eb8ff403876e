"""Speculative decoding bundles: what fetch resolves, the verify-length graph in every plugin, the config fields,
and the runtime refusing a bundle that would speculate without that graph."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mnnbuild_runtime.bundle import Bundle, compiled_lengths
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.tokenizer import Tokenizer

from mnnbuild.base.errors import ModelDirError
from mnnbuild.base.fsutil import sha256_file
from mnnbuild.cpu import load_vars
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import read_merge
from mnnbuild.model.spec import LocalSource
from mnnbuild.model.speculation import Speculation
from mnnbuild.stages.config import chunk_limits
from mnnbuild.stages.fetch import FetchInputs, FetchManifest, FetchParams, fetch
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, doit

PLAIN, LOOK, EAGLE, EAGLE_ND = "tiny-plain", "tiny-look", "tiny-eagle", "tiny-eagle-nd"
EAGLE_MODEL_DIR = FIXTURE_MODELS / "qwen3-eagle-random"
DRAFT_FILES = ("eagle.mnn", "eagle.mnn.weight", "eagle_fc.mnn", "eagle_fc.mnn.weight", "eagle_d2t.mnn")


def fetch_with(src: Path, out: Path, **asked: object) -> FetchManifest:
    inputs = FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src)
    return fetch(inputs, FetchParams(**asked), out)  # type: ignore[arg-type]


def model_with_config(tmp_path: Path, **fields: object) -> Path:
    """A copy of the tiny model whose config.json also has ``fields``."""
    dst = tmp_path / "src-model"
    shutil.copytree(TINY_MODEL_DIR, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **fields}))
    return dst


def test_lookahead_is_resolved_from_spec_or_model_config(tmp_path: Path) -> None:
    assert fetch_with(TINY_MODEL_DIR, tmp_path / "plain").speculation is None
    asked = fetch_with(TINY_MODEL_DIR, tmp_path / "asked", speculative="lookahead").speculation
    assert asked == Speculation(kind="lookahead", draft_predict_length=3) and asked.verify_length == 4
    own = model_with_config(tmp_path, speculative_type="lookahead", draft_predict_length=5)
    assert fetch_with(own, tmp_path / "own").speculation == Speculation(kind="lookahead", draft_predict_length=5)
    overridden = fetch_with(own, tmp_path / "override", draft_predict_length=2).speculation
    assert overridden is not None and overridden.verify_length == 3
    assert fetch_with(own, tmp_path / "off", speculative="off").speculation is None


def test_the_verify_length_is_one_more_graph_unless_it_is_a_prefill_length() -> None:
    look, eagle = (
        Speculation(kind="lookahead", draft_predict_length=3),
        Speculation(kind="eagle", draft_predict_length=3),
    )
    assert look.graph_lengths((1, 128)) == (1, 128, 4)
    assert look.graph_lengths((1, 128, 4)) == (1, 128, 4)  # the prefill graph at 4 serves both
    assert look.graph_lengths((1, 128, 2)) == (1, 128, 2, 4)  # appended: graphllm2_<k> stays the 2-token graph
    assert chunk_limits((128, 2), look) == [128, 4, 2, 1] and chunk_limits((128, 4), look) == [128, 4, 1]
    assert chunk_limits((128, 2), eagle) == [128, 2, 1] and chunk_limits((128, 2), None) == [128, 2, 1]
    # without the decode graph: no 1-row graph, and the engine pads a one-token forward to the verify length
    bare = Speculation(kind="eagle", draft_predict_length=3, decode_graph=False)
    assert bare.graph_lengths((1, 128), decode=1) == (128, 4) and bare.graph_lengths((1, 128)) == (1, 128, 4)
    assert chunk_limits((128,), bare) == [128, 4] and chunk_limits((128, 4), bare) == [128, 4]
    # the default is left out of a manifest, so a bundle built before the field keeps its keys
    assert "decode_graph" not in eagle.model_dump() and bare.model_dump()["decode_graph"] is False
    assert "decode_graph" not in FetchParams().model_dump() and not FetchParams(decode_graph=False).decode_graph


@pytest.mark.parametrize(
    ("config", "asked", "expected"),
    [
        (
            {},
            {"speculative": "eagle"},
            "(source of m): required file eagle.mnn is missing: spec field 'speculative' is 'eagle', which needs the "
            "Eagle draft's files (config.json field 'eagle_model', default 'eagle.mnn')",
        ),
        (
            {"speculative_type": "eagle"},
            {},
            "required file eagle.mnn is missing: config.json field 'speculative_type' is 'eagle', which needs",
        ),
        (
            {"speculative_type": "mtp"},
            {},
            "config.json: field 'speculative_type' is 'mtp'; bundles are built for 'eagle' or 'lookahead' "
            "speculation: set spec field speculative = 'off'",
        ),
        ({"draft_predict_length": "3"}, {"speculative": "lookahead"}, "field 'draft_predict_length' must be a pos"),
        (
            {},
            {"decode_graph": False},
            "(source of m): spec field 'decode_graph' is false, but the bundle does not speculate (config.json sets "
            "no 'speculative_type' and the spec's 'speculative' is unset), so a one-token forward would have no graph",
        ),
        (
            {},
            {"speculative": "lookahead", "decode_graph": False},
            "spec field 'decode_graph' is false, but spec field 'speculative' is 'lookahead': lookahead runs the "
            "target at one token when no n-gram matches",
        ),
    ],
    ids=[
        "eagle-asked-of-a-plain-model",
        "eagle-config-of-a-plain-model",
        "unsupported-kind",
        "bad-draft-length",
        "no-decode-graph-without-speculation",
        "no-decode-graph-with-lookahead",
    ],
)
def test_a_model_that_cannot_speculate_is_one_line_at_fetch(
    tmp_path: Path, config: dict[str, object], asked: dict[str, object], expected: str
) -> None:
    src = model_with_config(tmp_path, **config)
    with pytest.raises(ModelDirError) as exc:
        fetch_with(src, tmp_path / "out", **asked)
    assert expected in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's bundle without speculation and with lookahead, and the Eagle pair's, verified: one doit
    run."""
    root = tmp_path_factory.mktemp("speculative")
    specs = root / "specs"
    specs.mkdir()
    for name, src, extra in (
        (PLAIN, TINY_MODEL_DIR, ""),
        (LOOK, TINY_MODEL_DIR, 'speculative = "lookahead"\n'),
        (EAGLE, EAGLE_MODEL_DIR, ""),  # its config.json asks for Eagle
        (EAGLE_ND, EAGLE_MODEL_DIR, "decode_graph = false\n"),
    ):
        (specs / f"{name}.toml").write_text(
            f'name = "{name}"\nsource = {{ local = "{src}" }}\nchunk_size = 128\ntargets = ["v79"]\n{extra}'
        )
    tasks = [*(f"bundle:{name}-v79" for name in (PLAIN, LOOK)), f"verify:{EAGLE}-v79", f"verify:{EAGLE_ND}-v79"]
    doit(root, *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)}, check=True)
    return root / "artifacts"


def bundle_dir(artifacts: Path, name: str, model_dir_name: str = TINY_MODEL_DIR.name) -> Path:
    return artifacts / name / "v79" / "bundle" / "model" / model_dir_name


@pytest.mark.slow
def test_lookahead_adds_the_verify_graph_to_every_plugin(built: Path) -> None:
    plain, look = read_merge(built / PLAIN / "partition"), read_merge(built / LOOK / "partition")
    assert plain.keys() == look.keys() and plain
    for binary, graphs in look.items():
        # the prefill graphs keep their names; the verify length's is appended
        assert graphs[:-1] == plain[binary] and len(graphs) == len(plain[binary]) + 1
    opened = Bundle.open(bundle_dir(built, LOOK))
    assert {frozenset(compiled_lengths(p) or ()) for p in opened.plugins} == {frozenset({1, 4, 128})}
    assert {frozenset(compiled_lengths(p) or ()) for p in Bundle.open(bundle_dir(built, PLAIN)).plugins} == {
        frozenset({1, 128})
    }


@pytest.mark.slow
def test_lookahead_writes_the_engine_config(built: Path) -> None:
    config = json.loads((bundle_dir(built, LOOK) / "config_qnn.json").read_text())
    plain = json.loads((bundle_dir(built, PLAIN) / "config_qnn.json").read_text())
    added = {k: v for k, v in config.items() if k not in plain}
    assert added == {
        "speculative_type": "lookahead",
        "draft_predict_length": 3,
        "draft_match_strictness": "low",
        "draft_selection_rule": "freqxlen",
        "ngram_match_maxlen": 4,
        "ngram_update": False,
    }
    # lookahead's verify forward is padded to a chunk_limits entry by the engine: 4 is one
    assert config["chunk_limits"] == [128, 4, 1] and plain["chunk_limits"] == [128, 1]
    assert {k: v for k, v in config.items() if k in plain and k != "chunk_limits"} == {
        k: v for k, v in plain.items() if k != "chunk_limits"
    }


@pytest.mark.slow
def test_a_plain_bundle_has_no_speculation_and_ships_the_same_files(built: Path) -> None:
    plain, look = bundle_dir(built, PLAIN), bundle_dir(built, LOOK)
    assert "speculative_type" not in json.loads((plain / "config_qnn.json").read_text())
    names = sorted(p.relative_to(plain).as_posix() for p in plain.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(look).as_posix() for p in look.rglob("*") if p.is_file())
    assert not any(p.is_symlink() for p in look.rglob("*"))


@pytest.mark.slow
def test_a_bundle_without_the_verify_graph_is_refused_in_one_line(built: Path, tmp_path: Path) -> None:
    """A bundle whose config speculates but whose plugins lack the verify length: MNN's plugin would find no graph
    for the verify forward."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_dir(built, PLAIN), copy)
    config = json.loads((copy / "config_qnn.json").read_text())
    (copy / "config_qnn.json").write_text(json.dumps({**config, "speculative_type": "lookahead"}))
    with pytest.raises(BundleError) as exc:
        Bundle.open(copy)
    message = str(exc.value)
    assert "\n" not in message
    assert f"{copy / 'config_qnn.json'}: field 'speculative_type' is 'lookahead'" in message
    assert "verifies 4 tokens per forward" in message and "compiled for [1, 128] tokens" in message


def test_an_eagle_model_links_and_hashes_its_draft(tmp_path: Path) -> None:
    out = tmp_path / "model"
    manifest = fetch_with(EAGLE_MODEL_DIR, out)
    assert manifest.speculation == Speculation(
        kind="eagle",
        draft_predict_length=3,
        files=DRAFT_FILES,
        names={"eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn", "eagle_d2t": "eagle_d2t.mnn"},
    )
    records = {r.path: r for r in manifest.outputs}
    for name in DRAFT_FILES:
        assert (out / name).is_symlink() and (out / name).resolve() == (EAGLE_MODEL_DIR / name).resolve()
        assert records[name].sha256 == sha256_file(EAGLE_MODEL_DIR / name)


@pytest.mark.parametrize("missing", ["eagle.mnn", "eagle_fc.mnn", "eagle_d2t.mnn"])
def test_a_missing_draft_file_is_one_line_at_fetch(tmp_path: Path, missing: str) -> None:
    src = tmp_path / "src-model"
    shutil.copytree(EAGLE_MODEL_DIR, src)
    (src / missing).unlink()
    field = {"eagle.mnn": "eagle_model", "eagle_fc.mnn": "eagle_fc", "eagle_d2t.mnn": "eagle_d2t"}[missing]
    with pytest.raises(ModelDirError) as exc:
        fetch_with(src, tmp_path / "out")
    assert str(exc.value) == (
        f"model directory {src} (source of m): required file {missing} is missing: config.json field "
        f"'speculative_type' is 'eagle', which needs the Eagle draft's files (config.json field {field!r}, default "
        f"{missing!r}); expected the files llmexport --eagle_path writes beside the model"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_eagle_draft_longer_than_its_tree_is_refused(tmp_path: Path) -> None:
    """eagle_depth 3 x eagle_topk 1 drafts 3 tokens: the engine would verify 4, so a graph at 6 would never run."""
    with pytest.raises(ModelDirError) as exc:
        fetch_with(EAGLE_MODEL_DIR, tmp_path / "out", draft_predict_length=5)
    assert "spec field 'draft_predict_length' is 5, but an Eagle tree of eagle_depth 3 and eagle_topk 1" in str(
        exc.value
    )


def test_the_engine_is_not_handed_an_eagle_config_without_its_draft(tmp_path: Path) -> None:
    """PyPI MNN crashes (SIGSEGV) loading an Eagle config whose eagle_d2t file is missing: refused in one line."""
    src = tmp_path / "src-model"
    shutil.copytree(EAGLE_MODEL_DIR, src)
    (src / "eagle_d2t.mnn").unlink()
    with pytest.raises(BundleError) as exc:
        Tokenizer(src / "config.json")
    assert str(exc.value).startswith(f"{src / 'config.json'}: field 'speculative_type' is 'eagle', so MNN's engine")
    assert "eagle_d2t 'eagle_d2t.mnn'" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow
def test_the_eagle_io_has_a_verify_sample_with_every_row_and_the_hidden_states(built: Path) -> None:
    io = IoManifest.read(built / EAGLE / "io")
    assert [s.seq_len for s in io.samples] == [1, 128, 4]
    verify = io.samples[2]
    assert {o.name: o.shape for o in verify.outputs} == {"logits": [1, 4, 1024], "hidden_states": [1, 4, 384]}
    fed = load_vars(built / EAGLE / "io" / verify.dir / "input.mnn")
    assert fed["logits_index"].tolist() == [0]  # every row's logits, as the engine verifies


@pytest.mark.slow
def test_an_eagle_bundle_outputs_hidden_states_and_ships_its_draft(built: Path) -> None:
    model_dir = bundle_dir(built, EAGLE, EAGLE_MODEL_DIR.name)
    opened = Bundle.open(model_dir)
    assert opened.output_names == ["logits", "hidden_states"]
    assert {frozenset(compiled_lengths(p) or ()) for p in opened.plugins} == {frozenset({1, 4, 128})}
    config = opened.config
    assert config["chunk_limits"] == [128, 1]  # Eagle verifies through forwardRaw: no padding, prefill unchanged
    assert {k: config[k] for k in ("speculative_type", "draft_predict_length", "hidden_states")} == {
        "speculative_type": "eagle",
        "draft_predict_length": 3,
        "hidden_states": True,
    }
    assert [config[k] for k in ("eagle_model", "eagle_fc", "eagle_d2t")] == list(DRAFT_FILES[::2])
    shipped = {r.path: r.sha256 for r in BundleManifest.read(built / EAGLE / "v79" / "bundle").outputs}
    for name in DRAFT_FILES:
        assert not (model_dir / name).is_symlink(), "the bundle ships copies"
        assert shipped[f"model/{EAGLE_MODEL_DIR.name}/{name}"] == sha256_file(EAGLE_MODEL_DIR / name)


@pytest.mark.slow
def test_verify_runs_every_verify_length_graph_and_the_whole_model_at_it(built: Path) -> None:
    """Verify's (a) runs each plugin's graph at the verify length in the simulator, (b) the whole model at it, with
    ``hidden_states`` compared as an output."""
    report = json.loads((built / EAGLE / "v79" / "verify" / "verify.json").read_text())
    assert report["passed"]
    merge = read_merge(built / EAGLE / "partition")
    ran = {g["graph"]: g["passed"] for g in report["graphs"]}
    verify_graphs = [Path(graphs[-1]).name for graphs in merge.values()]
    assert verify_graphs and all(ran[g] for g in verify_graphs)
    at_four = next(w for w in report["whole_model"] if w["seq_len"] == 4)
    assert {o["name"]: (o["shape"], o["passed"]) for o in at_four["outputs"]} == {
        "logits": ([1, 4, 1024], True),
        "hidden_states": ([1, 4, 384], True),
    }


@pytest.mark.slow
def test_an_eagle_bundle_without_the_decode_graph_keeps_one_row_only_where_the_engine_runs_it(built: Path) -> None:
    """``decode_graph = false``: the layer plugins hold the prefill and verify-length graphs only; the plugins after
    the ``logits_index`` slice keep a 1-row graph (an unpadded prefill block's last row), taken from the whole-block
    samples; the engine pads a one-token forward to the verify length (``chunk_limits`` without 1); verify passes,
    those whole-block forwards and the speculative loop included."""
    opened = Bundle.open(bundle_dir(built, EAGLE_ND, EAGLE_MODEL_DIR.name))
    assert opened.config["chunk_limits"] == [128, 4]
    lengths = [compiled_lengths(p) for p in opened.plugins]
    with_one = [i for i, n in enumerate(lengths) if n is not None and 1 in n]
    assert all(n == {4, 128} for i, n in enumerate(lengths) if i not in with_one)
    assert with_one and with_one == list(range(len(lengths) - len(with_one), len(lengths)))  # the last plugins
    assert all(lengths[i] == {1, 4, 128} for i in with_one)
    bare, full = read_merge(built / EAGLE_ND / "partition"), read_merge(built / EAGLE / "partition")
    assert bare.keys() == full.keys()
    graphs = sum(len(g) for g in bare.values())
    assert graphs == sum(len(g) for g in full.values()) - (len(bare) - len(with_one))
    report = json.loads((built / EAGLE_ND / "v79" / "verify" / "verify.json").read_text())
    assert report["passed"] and report["speculation"]["passed"]
    ran = {(w["seq_len"], w.get("logits_index") or 0): w["passed"] for w in report["whole_model"]}
    assert ran == {(128, 0): True, (4, 0): True, (128, -1): True, (4, -1): True}
    assert len(report["graphs"]) >= graphs and all(g["passed"] for g in report["graphs"])
