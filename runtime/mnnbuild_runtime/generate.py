"""Token embeddings and greedy generation without a host KV cache.

Every step re-runs the whole sequence through the prefill shape: the tokens so far are embedded and
zero-padded to the chunk size, the causal mask hides the padding from the real rows, positions are
``0..chunk-1`` and ``logits_index`` 0 asks for the logits of every row; the next token is the argmax of
the row of the last real token. The same scheme runs the bundle (:func:`greedy_generate`) and the
original model whole in MNN on the CPU (:func:`cpu_greedy_generate`), so their tokens are comparable.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.cpu import CpuRuntime, load_module, to_numpy, to_var
from mnnbuild.errors import MNNFormatError
from mnnbuild.mnn import embedding_info, read_embeddings
from mnnbuild_runtime.bundle import bundle_path
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.hybrid import HybridModel

log = logging.getLogger(__name__)

LLM_INPUTS = ("input_ids", "attention_mask", "position_ids", "logits_index")


class Embeddings:
    """Token id -> embedding row, from a model dir's ``llm_config.json`` (tied embeddings inside
    ``llm.mnn.weight``, or ``embeddings_bf16.bin``). Rows are cached, so a growing sequence reads each
    token once."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        self.model_dir = Path(model_dir)
        try:
            self.info = embedding_info(self.model_dir)
        except MNNFormatError as exc:
            raise BundleError(f"{self.model_dir}: cannot locate the token embeddings: {exc}") from exc
        self._rows: dict[int, np.ndarray] = {}

    @property
    def hidden(self) -> int:
        return self.info.hidden

    @property
    def vocab(self) -> int:
        return self.info.vocab

    def __call__(self, tokens: Sequence[int]) -> np.ndarray:
        """float32 ``[len(tokens), hidden]``."""
        ids = [int(t) for t in tokens]
        todo = sorted({t for t in ids if t not in self._rows})
        if todo:
            try:
                rows = read_embeddings(self.model_dir, todo)
            except MNNFormatError as exc:
                raise BundleError(f"{self.model_dir}: embedding lookup failed: {exc}") from exc
            self._rows.update(zip(todo, rows, strict=True))
        if not ids:
            return np.zeros((0, self.hidden), dtype=np.float32)
        return np.stack([self._rows[t] for t in ids]).astype(np.float32, copy=False)


def causal_mask(seq: int) -> np.ndarray:
    """``[1,1,seq,seq]`` float: 0 on and below the diagonal, the lowest float above it."""
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, dtype=np.float32), k=1)
    return mask.reshape(1, 1, seq, seq)


def llm_inputs(embeds: np.ndarray, seq: int | None = None, logits_index: int | None = None) -> dict[str, np.ndarray]:
    """The four LLM graph inputs for embeddings ``[n, hidden]``, zero-padded to ``seq`` rows.

    ``logits_index`` defaults to -1 (last row only) for one row and 0 (every row) otherwise."""
    n, hidden = embeds.shape
    seq = n if seq is None else seq
    if n > seq:
        raise ValueError(f"{n} embedding rows do not fit in a sequence of {seq}")
    padded = np.zeros((seq, 1, hidden), dtype=np.float32)
    padded[:n, 0, :] = embeds
    if logits_index is None:
        logits_index = -1 if seq == 1 else 0
    return {
        "input_ids": padded,
        "attention_mask": causal_mask(seq),
        "position_ids": np.arange(seq, dtype=np.int32).reshape(1, seq),
        "logits_index": np.array([logits_index], dtype=np.int32),
    }


@dataclass
class GenerationResult:
    prompt: list[int]
    tokens: list[int]
    """The generated tokens only."""
    stop_reason: str  # "max_new_tokens", "chunk_full" or "stop_token"
    chunk: int
    step_seconds: list[float] = field(default_factory=list)
    top2_margins: list[float] = field(default_factory=list)
    """Per step, top-1 minus top-2 logit: a small margin makes a divergence from another run expected."""

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "tokens": self.tokens,
            "stop_reason": self.stop_reason,
            "chunk": self.chunk,
            "step_seconds": self.step_seconds,
            "top2_margins": self.top2_margins,
        }


ForwardFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def recompute_generate(
    forward: ForwardFn,
    embed: Callable[[Sequence[int]], np.ndarray],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    chunk: int,
    stop_ids: Sequence[int] = (),
) -> GenerationResult:
    """The greedy loop shared by the bundle and the CPU reference (see the module docstring)."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("empty prompt")
    if len(prompt) > chunk:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit the prefill chunk of {chunk}")
    seq = list(prompt)
    result = GenerationResult(prompt, [], "max_new_tokens", chunk)
    stops = {int(t) for t in stop_ids}
    while len(result.tokens) < max_new_tokens:
        if len(seq) >= chunk:
            result.stop_reason = "chunk_full"
            break
        t0 = time.perf_counter()
        outputs = forward(llm_inputs(embed(seq), chunk, logits_index=0))
        logits = np.asarray(outputs["logits"])
        rows = logits.reshape(-1, logits.shape[-1])
        if rows.shape[0] != chunk:
            raise BundleError(f"logits have {rows.shape[0]} rows for a sequence of {chunk}; expected one per row")
        row = rows[len(seq) - 1]
        token = int(np.argmax(row))
        top2 = np.partition(row, -2)[-2:]
        result.top2_margins.append(float(top2[1] - top2[0]))
        result.step_seconds.append(time.perf_counter() - t0)
        result.tokens.append(token)
        seq.append(token)
        if token in stops:
            result.stop_reason = "stop_token"
            break
    log.info("generated %d tokens (%s)", len(result.tokens), result.stop_reason)
    return result


def greedy_generate(
    model: HybridModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    stop_ids: Sequence[int] = (),
    embeddings: Embeddings | None = None,
) -> GenerationResult:
    """Greedy tokens from the bundle, using only its prefill shape (``max(chunk_limits)``)."""
    embed = embeddings or Embeddings(model.bundle.model_dir)
    return recompute_generate(model.forward, embed, prompt_ids, max_new_tokens, model.bundle.chunk_size, stop_ids)


def _original_model_file(model_dir: Path) -> tuple[Path, Path | None]:
    config_path = model_dir / "config.json"
    llm_model, llm_weight = "llm.mnn", "llm.mnn.weight"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BundleError(f"{config_path}: not valid JSON: {exc}") from exc
        if not isinstance(config, dict):
            raise BundleError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
        llm_model = config.get("llm_model", llm_model)
        llm_weight = config.get("llm_weight", llm_weight)
    model_file = bundle_path(model_dir, llm_model, f"{config_path}: field 'llm_model'")
    weight_file = bundle_path(model_dir, llm_weight, f"{config_path}: field 'llm_weight'")
    if not model_file.is_file():
        raise BundleError(f"{model_dir}: model file {model_file} does not exist")
    return model_file, weight_file if weight_file.is_file() else None


def cpu_forward_fn(model_dir: str | os.PathLike[str], runtime: CpuRuntime | None = None) -> ForwardFn:
    """A forward function running the ORIGINAL model dir's ``llm.mnn`` whole in MNN on the CPU."""
    model_dir = Path(model_dir)
    model_file, weight_file = _original_model_file(model_dir)
    rt = (runtime or CpuRuntime()).create(weight_file)
    module = load_module(model_file, rt)
    info = module.get_info()
    in_names, out_names = list(info["inputNames"]), list(info["outputNames"])

    def forward(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = module.forward([to_var(np.ascontiguousarray(inputs[n])) for n in in_names])
        return {n: to_numpy(v) for n, v in zip(out_names, outs, strict=True)}

    return forward


def cpu_greedy_generate(
    model_dir: str | os.PathLike[str],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    chunk: int,
    stop_ids: Sequence[int] = (),
    runtime: CpuRuntime | None = None,
) -> GenerationResult:
    """The reference: the same recompute loop on the original model dir, ``llm.mnn`` whole in MNN CPU."""
    embed = Embeddings(model_dir)
    return recompute_generate(cpu_forward_fn(model_dir, runtime), embed, prompt_ids, max_new_tokens, chunk, stop_ids)
