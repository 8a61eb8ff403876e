"""Lookahead speculative decoding (`mnnbuild_runtime.lookahead`): the n-gram drafter follows MNN's engine rules and
drafts what the engine drafts (the same target forwards for the same prompts), and a lookahead bundle's speculative
greedy tokens are its plain greedy ones in verify, which fails in one line when the verify-length graph is gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mnnbuild_runtime import Embeddings, cpu_forward_fn
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.lookahead import LookaheadDrafter, LookaheadSettings, StdCounts
from mnnbuild_runtime.speculative import engine_generate, speculative_generate
from mnnbuild_runtime.tokenizer import Tokenizer

from mnnbuild.base.errors import ToleranceError
from mnnbuild.base.fsutil import sha256_file
from mnnbuild.mnn import load_model, plugin_attributes, save_model
from mnnbuild.model.targets import soc_for_arch
from mnnbuild.stages.verify import REPORT_JSON, REPORT_TEXT, VerifyInputs, VerifyParams, verify
from mnnbuild.verify.verdict import VerifyReport
from tests.conftest import PROJECT_ROOT, doit

TRAINED = PROJECT_ROOT / "models" / "tiny-qwen3-trained"
NAME = "tiny-look"

# ---- the engine's rules, on a made-up prompt ---------------------------------------------------------

# 2 follows 7, 4, 4, 4 (3x), 5, 5 (2x); 5 follows 2 with 8, then 6 (a tie); 6 is followed by 1, 1 by nothing
PROMPT = [7, 2, 4, 2, 4, 2, 4, 3, 2, 5, 8, 2, 5, 6, 1]


def drafter(comma: int | None = None, **settings: object) -> LookaheadDrafter:
    """A drafter on ``PROMPT`` with made-up token texts (``comma`` decodes to ",")."""
    got = LookaheadDrafter(
        TRAINED,
        settings=LookaheadSettings(draft_length=3, max_key=2, **settings),  # type: ignore[arg-type]
        decode=lambda t: "," if t == comma else f"w{t}",
        encode=lambda text: [],
    )
    got.start(PROMPT)
    return got


def test_std_counts_iterate_in_libstdcxx_order() -> None:
    """Which of two equally scored tokens the engine drafts is the first its ``std::unordered_map`` yields; the
    order libstdc++ (g++ 12.2, the box's libstdc++.so.6) gave for these inserts, 13 buckets and then grown twice to
    59, printed by a ten-line C++ program (insert each id, ``++count`` when present, print the iteration)."""
    seq = [(i * 37 + 11) % 101 + (13 if i % 5 == 0 else 0) for i in range(40)]
    counts = StdCounts()
    for t in seq[:13]:
        counts.add(t)
    assert [t for t, _ in counts.items()] == [51, 14, 91, 41, 68, 31, 4, 108, 58, 21, 85, 48, 24]
    for t in seq[13:]:
        counts.add(t)
    libstdcxx = ("3:1 67:1 30:1 20:1 84:1 51:1 14:1 91:2 4:1 41:1 68:1 31:1 108:1 21:1 58:1 0:1 85:1 107:1 48:1 24:2 "
                 "88:1 74:2 98:1 40:2 34:1 71:1 7:1 57:2 81:1 23:1 17:1 54:1 64:1 37:1 47:1")  # fmt: skip
    assert " ".join(f"{t}:{c}" for t, c in counts.items()) == libstdcxx
    assert sorted(counts.items()) != counts.items()  # not an order that sorting or insertion would give


def test_the_drafter_follows_the_engines_rules() -> None:
    """count x key length scores (a frequent 1-gram beats a rare 2-gram); a tie goes to the unordered map's first;
    a found draft is padded with 0; no match drafts nothing; after a punctuation token the first draft must hold a
    share of its key's counts ("high": 80% for a 2-gram, 90% for a 1-gram; "medium": 50% for a 2-gram), and a token
    that outscores another and then fails its share leaves no draft; "fcfs" takes the first token seen."""
    d = drafter()
    assert d.propose([*PROMPT, 8, 2]) == [4, 2, 4]  # (8,2)->5 scores 2, (2)->4 scores 3
    assert d.propose([*PROMPT, 2, 5]) == [6, 1, 0]  # (2,5)->{8,6} tie: libstdc++ yields 6 first; (6,1) unseen
    assert d.propose([*PROMPT, 9, 9]) == []
    assert drafter(comma=5).propose([*PROMPT, 2, 5]) == []  # 50% of (2,5)'s counts: not "high"
    # (8,2)->5 holds all its counts, but (2)->4 outscores it and holds 60%, not high's 90%: no draft at all
    assert drafter(comma=2).propose([*PROMPT, 8, 2]) == []
    assert drafter(strictness="medium").propose([*PROMPT, 2, 5]) == [6, 1, 0]  # 50% is medium's 50% for 2-grams
    assert drafter(rule="fcfs").propose([*PROMPT, 2, 5]) == [8, 2, 5]


def test_lookahead_settings_come_from_the_config(tmp_path: Path) -> None:
    config = {"llm_model": "llm.mnn", "speculative_type": "lookahead", "ngram_match_maxlen": 3,
              "draft_selection_rule": "fcfs", "ngram_update": True, "draft_match_strictness": "medium"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "lookup_file.txt").write_text("prior text")
    got = LookaheadSettings.of(tmp_path / "config.json")
    assert (got.max_key, got.rule, got.update, got.draft_length) == (3, "fcfs", True, 3)
    assert got.strictness == "medium"  # an unknown one is refused (test_untried_faults.py)
    assert got.lookup_file == tmp_path / "lookup_file.txt"
    (tmp_path / "config.json").write_text(json.dumps({**config, "ngram_match_maxlen": 9}))
    with pytest.raises(BundleError) as exc:
        LookaheadSettings.of(tmp_path / "config.json")
    assert str(exc.value) == (
        f"{tmp_path / 'config.json'}: field 'ngram_match_maxlen' must be a positive int and at most 8 (the engine's "
        "longest key), got 9"
    )


# ---- against MNN's engine on the trained model --------------------------------------------------------


def repeating_prompt(start: str, tokenizer: Tokenizer) -> str:
    """``start``, its 40 greedy tokens (MNN's engine's), a blank line and ``start`` again: a prompt the
    continuation may copy from."""
    plain = engine_generate(TRAINED / "config.json", start, 40, speculative=False)
    return start + tokenizer.decode(plain.tokens) + "\n\n" + start


@pytest.mark.slow
def test_the_drafter_needs_the_forwards_mnns_engine_needs() -> None:
    """PyPI MNN's engine with ``speculative_type = "lookahead"`` on the CPU and the runtime's loop with this
    drafter, on the same prompts and settings: the same tokens added per target forward, round by round (the
    engine's rounds read from where it stops, `engine_generate`), and the engine's plain greedy tokens. "Computes
    the" decides ties between equally scored drafts: with another order than libstdc++'s the drafter needs other
    forwards there; "Applies a 2D convolution over" takes whole drafts."""
    tokenizer, forward, embed = Tokenizer(TRAINED / "config.json"), cpu_forward_fn(TRAINED), Embeddings(TRAINED)
    computes, applies = (repeating_prompt(s, tokenizer) for s in ("Computes the", "Applies a 2D convolution over"))
    cases = (
        (computes, LookaheadSettings()),
        (computes, LookaheadSettings(update=True)),
        (applies, LookaheadSettings()),
        (applies, LookaheadSettings(rule="fcfs", update=True)),
    )
    accepted = 0
    for prompt, settings in cases:
        run = engine_generate(TRAINED / "config.json", prompt, 16, speculative=True,
                              settings={"speculative_type": "lookahead", **settings.engine_config()})  # fmt: skip
        assert run.rounds is not None and sum(run.rounds) == len(run.tokens) >= 16
        spec = speculative_generate(forward, embed, LookaheadDrafter(TRAINED, settings=settings), run.prompt_ids,
                                    len(run.tokens) + 1, 128)  # fmt: skip
        assert [r.tokens for r in spec.rounds[1:]] == run.rounds, (prompt[-30:], settings)
        plain = engine_generate(TRAINED / "config.json", prompt, len(run.tokens), speculative=False)
        assert run.tokens == plain.tokens == spec.result.tokens[: len(run.tokens)]
        accepted += sum(r.accepted for r in spec.rounds)
    assert accepted > 0  # drafts held somewhere: the rounds compared are not all one-token forwards


# ---- a lookahead bundle, verified ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def looked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained model built for lookahead and verified on a prompt its continuation copies from."""
    root = tmp_path_factory.mktemp("lookahead")
    prompt = repeating_prompt("Applies a 2D convolution over", Tokenizer(TRAINED / "config.json"))
    specs = root / "specs"
    specs.mkdir()
    (specs / f"{NAME}.toml").write_text(
        f'name = "{NAME}"\nsource = {{ local = "{TRAINED}" }}\nchunk_size = 128\ntargets = ["v79"]\n'
        f'speculative = "lookahead"\nverify = {{ prompt = {json.dumps(prompt)}, max_new_tokens = 32 }}\n'
    )
    doit(root, f"report:{NAME}-v79", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=True)
    return root / "artifacts" / NAME


@pytest.mark.slow
def test_a_lookahead_bundle_speculates_losslessly_as_the_engine_does(looked: Path) -> None:
    """verify (c) on the lookahead bundle: its speculative greedy tokens (n-gram drafts on the CPU, forwards in the
    simulator) are the CPU's plain greedy ones; drafts held (more than one token per forward), with exactly the
    rounds MNN's engine runs for that prompt; verify.txt and the page report it."""
    report = VerifyReport.model_validate_json((looked / "v79" / "verify" / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.passed
    # the engine's verify forward (draft_predict_length 3 + 1 rows) is io's sample of that length, and every graph
    # at that length ran in the simulator; 4 is in chunk_limits, so a prompt's last 4 tokens run there whole
    # (logits_index -1) as a full 128-token chunk does
    got = sorted((s.seq_len, s.logits_index or 0) for s in report.whole_model)
    assert got == [(1, 0), (4, -1), (4, 0), (128, -1), (128, 0)] and all(s.passed for s in report.whole_model)
    rows = {g.outputs[0].shape[1] for g in report.graphs}  # a graph's first output: [1, rows, width]
    at_four = [g for g in report.graphs if g.outputs[0].shape[1] == 4]
    assert rows == {1, 4, 128} and len(at_four) == len(report.plugins)
    assert all(g.passed and g.fed == "bundle_pass" for g in at_four)
    spec = report.speculation
    assert spec is not None and spec.passed and spec.kind == "lookahead" and spec.problem is None
    assert spec.verify_length == 4
    assert spec.settings == {"draft_match_strictness": "low", "draft_selection_rule": "freqxlen",
                             "ngram_match_maxlen": 4, "ngram_update": False}  # fmt: skip
    assert spec.tree is None and spec.note is None
    assert spec.bundle_tokens == spec.cpu_tokens and len(spec.cpu_tokens) == 32 and spec.first_difference is None
    assert report.generation is not None and spec.cpu_tokens == report.generation.cpu_tokens
    assert all(len(r.draft) in (0, 3) for r in spec.rounds if not r.cut)  # padded to the verify length, or none
    assert spec.mean_accepted is not None and spec.mean_accepted > 1.0
    assert spec.npu_weight_bytes_per_forward and spec.npu_weight_bytes_per_token == pytest.approx(
        spec.npu_weight_bytes_per_forward / spec.mean_accepted
    )
    prompt = (looked / "v79" / "bundle" / "model" / TRAINED.name / "prompt.txt").read_text(encoding="utf-8").strip()
    run = engine_generate(TRAINED / "config.json", prompt, 32, speculative=True,
                          settings={"speculative_type": "lookahead"})  # fmt: skip
    assert run.prompt_ids == spec.prompt_ids and run.tokens[:32] == spec.cpu_tokens
    assert run.rounds is not None and [r.tokens for r in spec.rounds[1:]] == run.rounds[: len(spec.rounds) - 1]
    text = (looked / "v79" / "verify" / REPORT_TEXT).read_text(encoding="utf-8")
    assert "speculative decoding (lookahead): draft_predict_length 3, draft_match_strictness low" in text
    assert "hybrid (bundle, n-gram drafts, speculative)" in text and "tokens identical: pass" in text
    page = (looked / "v79" / "report" / "index.html").read_text(encoding="utf-8")
    assert "lookahead&#39;s n-gram drafts on the CPU" in page or "lookahead's n-gram drafts on the CPU" in page


@pytest.mark.slow
def test_a_lookahead_bundle_without_its_verify_length_graph_fails_verify_in_one_line(
    looked: Path, tmp_path: Path
) -> None:
    """Every plugin of the lookahead bundle loses its 4-row graph (the shape and graph name the engine would pick
    it by), the bundle manifest re-hashed as if built so: verify fails in one line naming the missing length."""
    bundle = tmp_path / "bundle"
    shutil.copytree(looked / "v79" / "bundle", bundle)
    llm = bundle / "model" / TRAINED.name / "qnn" / "llm.mnn"
    model = load_model(llm)
    for op in model.ops:
        if op.type != "Plugin":
            continue
        attrs = plugin_attributes(op)
        shapes = len(attrs["allGraphName"])
        per_shape = len(attrs["allInputShape"]) // shapes
        blocks = [attrs["allInputShape"][s * per_shape : (s + 1) * per_shape] for s in range(shapes)]
        # the sequence dims: 1 in the decode shape, varying between shapes (as the runtime reads them)
        seq = [i for i in range(per_shape) if min(b[i] for b in blocks) == 1 and len({b[i] for b in blocks}) > 1]
        drop = [s for s, b in enumerate(blocks) if {b[i] for i in seq} == {4}]
        assert len(drop) == 1, blocks
        keep = [a for a in op.main.attr if not a.key.startswith(f"o_{drop[0]}_")]
        for a in keep:
            if a.key == "allGraphName":
                a.list.s = [n for i, n in enumerate(a.list.s) if i != drop[0]]
            elif a.key == "allInputShape":
                a.list.i = [v for i, v in enumerate(a.list.i) if i // per_shape != drop[0]]
        op.main.attr = keep
    save_model(model, llm)
    manifest = bundle / "bundle.manifest.json"
    data = json.loads(manifest.read_text(encoding="utf-8"))
    rel = llm.relative_to(bundle).as_posix()
    for rec in data["outputs"]:
        if rec["path"] == rel:
            rec.update(size=llm.stat().st_size, sha256=sha256_file(llm))
    manifest.write_text(json.dumps(data), encoding="utf-8")
    root, arch = looked, looked / "v79"
    inputs = VerifyInputs(model=NAME, bundle_dir=bundle, partition_dir=root / "partition", io_dir=root / "io",
                          model_dir=root / "model", context_dir=arch / "context", twin_dir=arch / "twin")  # fmt: skip
    with pytest.raises(ToleranceError) as err:
        verify(inputs, VerifyParams(soc=soc_for_arch("v79")), tmp_path / "verify")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"verify {NAME}-v79 FAILED: ")
    expected = ("field 'speculative_type' is 'lookahead': MNN's engine verifies 4 tokens per forward "
                "(draft_predict_length 3 + 1), but plugin ")  # fmt: skip
    assert expected in message and "was compiled for [1, 128] tokens" in message, message
