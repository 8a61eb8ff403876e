"""The trained tiny model (``models/tiny-qwen3-trained``): evidence the random-weight models cannot give.

Its bundle is built and verified through doit, as a user runs it: the generation check must compare real text (the
greedy tokens, equal on the CPU and on the bundle, decode to words of the model's training corpus, listed in
``corpus-words.txt`` beside it) decided by clear margins, not near-ties. On a fixed text read by both models on the
CPU, the trained model predicts the next token where the random one predicts none.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import Embeddings, Tokenizer, cpu_forward_fn, llm_inputs

from mnnbuild.base.compare import Tolerance
from mnnbuild.manifests.verify import VerifyManifest
from mnnbuild.mnn.llm import MODEL_CONFIG
from mnnbuild.model.spec import load_spec
from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR, CONFIG_FILE, PROMPT_FILE, VERIFY_REPORT_JSON
from mnnbuild.verify.compare import top2_margin
from mnnbuild.verify.report import VerifyReport
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR, doit

TRAINED = "tiny-qwen3-trained"
ARCH = "v79"
TRAINED_DIR = PROJECT_ROOT / "models" / TRAINED
SPEC = load_spec(PROJECT_ROOT / "models" / f"{TRAINED}.toml")

# API documentation prose, written for this test (not copied from the corpus): both models read it.
TEXT = (
    "Computes the sum of the elements of the input tensor along the given dimension. "
    "Returns a new tensor with the same data as the input tensor but of a different shape. "
    "If keepdim is True, the output tensor is of the same size as input except in the dimension dim."
)


def corpus_words() -> set[str]:
    return set((TRAINED_DIR / "corpus-words.txt").read_text(encoding="utf-8").split())


def words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Za-z]+", text)]


def near_tie(row: np.ndarray, tol: Tolerance) -> bool:
    """verify's near-tie: the top-1 leads the runner-up by at most ``tie_margin`` of the row's max |logit|."""
    return top2_margin(row) <= tol.tie_margin * float(np.abs(row).max())


def cpu_rows(model_dir: Path, ids: list[int]) -> np.ndarray:
    """The original model's logits rows for ``ids`` (one prefill on the CPU, padding rows dropped)."""
    feed = llm_inputs(Embeddings(model_dir)(ids), seq=SPEC.prefill_lengths[0])
    logits = np.asarray(cpu_forward_fn(model_dir)(feed)["logits"], dtype=np.float64)
    return logits.reshape(SPEC.prefill_lengths[0], -1)[: len(ids)]


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, VerifyReport]:
    """`doit verify` of the trained model from scratch; its artifacts and verify report."""
    cwd = tmp_path_factory.mktemp("trained")
    proc = doit(cwd, f"verify:{TRAINED}-{ARCH}")
    assert proc.returncode == 0, f"doit verify failed:\n{proc.stdout}\n{proc.stderr}"
    root = cwd / "artifacts" / TRAINED
    report = VerifyReport.model_validate_json((root / ARCH / "verify" / VERIFY_REPORT_JSON).read_text())
    return root, report


@pytest.mark.slow
def test_trained_bundle_generates_corpus_words_equal_on_cpu_and_bundle(verified: tuple[Path, VerifyReport]) -> None:
    root, report = verified
    assert VerifyManifest.read(root / ARCH / "verify").tokens_match and report.passed
    gen = report.generation
    assert gen is not None and gen.problem is None
    bundle = root / ARCH / "bundle" / BUNDLE_MODEL_DIR / TRAINED
    # the spec's prompt, shipped as the bundle's prompt.txt, is what verify generated from
    assert gen.prompt == SPEC.verify.prompt != "hello"
    assert (bundle / PROMPT_FILE).read_text(encoding="utf-8") == f"{SPEC.verify.prompt}\n"
    assert gen.first_divergence is None and gen.hybrid_tokens == gen.cpu_tokens
    assert len(gen.cpu_tokens) == SPEC.verify.max_new_tokens
    assert len(set(gen.cpu_tokens)) > 1, "one token repeated is what the random model generates"
    text = Tokenizer(bundle / CONFIG_FILE).decode(gen.hybrid_tokens)  # the bundle's own tokenizer
    assert text == gen.hybrid_text
    generated = words(text)
    assert generated, f"no words in {text!r}"
    unknown = [w for w in generated if w not in corpus_words()]
    assert not unknown, f"{text!r}: {unknown} are not words of the training corpus"


@pytest.mark.slow
def test_trained_generation_margins_are_not_near_ties(verified: tuple[Path, VerifyReport]) -> None:
    """Each greedy step's top-1 wins by more than verify's near-tie margin at most steps: the CPU's rows, computed
    again here from the original model, are the report's."""
    _, report = verified
    gen = report.generation
    assert gen is not None and gen.steps
    tol = report.model_tolerance
    ids = gen.prompt_ids + gen.cpu_tokens
    rows = cpu_rows(TRAINED_DIR, ids)  # the original model, which verify's fetch links
    start = len(gen.prompt_ids) - 1
    for step in gen.steps:
        row = rows[start + step.step]
        assert int(row.argmax()) == step.cpu_token
        assert top2_margin(row) == pytest.approx(step.cpu_margin, rel=1e-4, abs=1e-6)
    ties = [s.step for s in gen.steps if near_tie(rows[start + s.step], tol)]
    assert len(ties) < len(gen.steps) / 2, f"near-ties at steps {ties} of {len(gen.steps)}"


def test_trained_model_predicts_text_the_random_model_does_not() -> None:
    """On one text, both models on the CPU: the trained model's top-1 is the text's next token at more positions
    than the random model's, varies with the text, and is a near-tie at fewer than half the positions."""
    tol = Tolerance()
    found = {}
    for model_dir in (TRAINED_DIR, TINY_MODEL_DIR):
        ids = Tokenizer(model_dir / MODEL_CONFIG).encode(TEXT)
        rows = cpu_rows(model_dir, ids)
        picks = rows.argmax(axis=1)
        found[model_dir.name] = {
            "next": int((picks[:-1] == np.asarray(ids[1:])).sum()) / (len(ids) - 1),
            "distinct": len(set(picks.tolist())) / len(ids),
            "ties": sum(near_tie(r, tol) for r in rows) / len(ids),
        }
    trained, random = found[TRAINED], found[TINY_MODEL_DIR.name]
    assert trained["next"] > random["next"], found
    assert trained["distinct"] > random["distinct"], found
    assert trained["ties"] < 0.5, found
