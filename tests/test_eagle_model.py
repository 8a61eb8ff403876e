"""The shipped Eagle3 pair (``models/tiny-qwen3-eagle``): a trained target and its self-distilled draft, on the CPU.

MNN's own engine (PyPI ``MNN.llm``) decodes the prompts the pair was measured on (documents held out of its
training) greedily with and without speculation: the tokens must be the same, token for token, at full precision,
and the draft must buy at least two tokens per target forward (issue 41's goal). A draft whose vocabulary map is
wrong drafts other tokens: speculation then buys nothing, and still changes no token.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.model.spec import load_spec
from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

NAME = "tiny-qwen3-eagle"
MODEL_DIR = PROJECT_ROOT / "models" / NAME
RECORD = json.loads((MODEL_DIR / "training.json").read_text(encoding="utf-8"))
PROMPTS = RECORD["results"]["eval_prompts"]
NEW_TOKENS = RECORD["draft"]["training"]["eval_new_tokens"]
GOAL = 2.0
"""Mean tokens accepted per target forward on the held-out prompts (issue 41)."""


def generate(model_dir: Path, prompt: str, speculative: bool) -> tuple[list[int], int | None]:
    """Greedy tokens from ``prompt`` (no chat template) in MNN's engine at full precision, one CPU thread, and with
    speculation the number of target forwards after the prefill (which ``EagleGeneration`` appends to the
    context's ``output_tokens`` when it stops)."""
    import MNN.llm  # never MNN.tools

    engine = MNN.llm.create(str(model_dir / "config.json"))
    engine.set_config(
        {
            "backend_type": "cpu",
            "thread_num": 1,
            "precision": "high",
            "memory": "normal",
            "sampler_type": "greedy",
            "use_template": False,
            # plain decoding runs past the speculative run's end (it may accept up to 3 tokens beyond the limit)
            "max_new_tokens": NEW_TOKENS if speculative else NEW_TOKENS + 4,
            "speculative_type": "eagle" if speculative else "",
        }
    )
    engine.load()
    engine.response(prompt)
    out = list(engine.context.output_tokens)
    del engine
    return (out[:-1], out[-1]) if speculative else (out, None)


def speculate(model_dir: Path) -> tuple[list[tuple[list[int], list[int], int]], float]:
    """(speculative tokens, plain tokens, target forwards) per prompt, and the tokens accepted per forward."""
    runs = []
    for prompt in PROMPTS:
        spec_tokens, forwards = generate(model_dir, prompt, True)
        plain, _ = generate(model_dir, prompt, False)
        assert forwards is not None
        runs.append((spec_tokens, plain, forwards))
    decoded = sum(len(tokens) - 1 for tokens, _, _ in runs)  # the first token is the prefill's
    return runs, decoded / sum(forwards for _, _, forwards in runs)


def test_shipped_files_are_the_recorded_export() -> None:
    for name, digest in RECORD["files"].items():
        assert hashlib.sha256((MODEL_DIR / name).read_bytes()).hexdigest() == digest, name
    assert {"eagle.mnn", "eagle.mnn.weight", "eagle_fc.mnn", "eagle_fc.mnn.weight", "eagle_d2t.mnn"} <= set(
        RECORD["files"]
    )
    config = json.loads((MODEL_DIR / "config.json").read_text(encoding="utf-8"))
    assert config["speculative_type"] == "eagle" and config["hidden_states"] is True
    assert RECORD["model"]["num_layers"] >= 7 and len(set(RECORD["draft"]["taps"])) == 3
    spec = load_spec(PROJECT_ROOT / "models" / f"{NAME}.toml")
    assert spec.name == NAME and spec.verify.prompt


def test_speculative_greedy_tokens_equal_plain_and_accept_two_per_forward() -> None:
    runs, accepted = speculate(MODEL_DIR)
    for prompt, (tokens, plain, forwards) in zip(PROMPTS, runs, strict=True):
        assert len(tokens) > NEW_TOKENS, prompt  # ran to the limit: the held-out prompts do not end early
        assert tokens == plain[: len(tokens)], prompt
        assert (len(tokens) - 1) / 4 <= forwards <= len(tokens) - 1, prompt  # 1..4 tokens per forward
    assert accepted >= GOAL


def test_a_wrong_draft_vocabulary_costs_acceptance_not_tokens(tmp_path: Path) -> None:
    """The draft's indices read as target ids (``d2t`` all zero): the drafts are other tokens, so speculation buys
    next to nothing; the target still decides every token."""
    import MNN.expr as F

    broken = tmp_path / NAME
    shutil.copytree(MODEL_DIR, broken)
    loaded = F.load_as_list(str(MODEL_DIR / "eagle_d2t.mnn"))
    d2t = np.array(loaded[0].read(), dtype=np.int32).reshape(-1)
    assert d2t.any()  # a real map: the draft vocabulary is a subset of the target's
    zero = F.const(np.zeros_like(d2t), list(d2t.shape), F.NHWC, F.int)
    zero.name = "d2t"
    F.save([zero], str(broken / "eagle_d2t.mnn"))
    runs, accepted = speculate(broken)
    for prompt, (tokens, plain, _) in zip(PROMPTS, runs, strict=True):
        assert tokens == plain[: len(tokens)], prompt
    assert accepted < 1.5 < GOAL
