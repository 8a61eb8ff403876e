"""Token embeddings and greedy generation without a host KV cache.

Every step re-runs the whole sequence as one prefill block: the tokens so far are embedded and zero-padded to
the smallest prefill length that holds them (as MNN's engine pads a prompt's last block, ``chunks.fit_block``;
with one length, the chunk size), the causal mask hides the padding from the real rows, positions are
``0..size-1`` and ``logits_index`` 0 asks for the logits of every row; the next token is the argmax of the row
of the last real token. The same scheme runs the bundle (:func:`greedy_generate`) and the original model whole
in MNN on the CPU (:func:`cpu_greedy_generate`), so their tokens are comparable.

That loop's tokens can be had with far fewer forwards given a good guess (:func:`follow_draft`): with the
causal mask, row ``i`` of a forward over prompt + guess depends on tokens ``0..i`` only (the rows come out
bit-identical to the loop's), so one forward per length the loop would use confirms every guessed token up to
the first wrong one, and gives the right one in its place; the loop goes on from there, from a new guess when
there is a guesser (:func:`kv_cache_redraft`). The guesses come from MNN's own LLM engine and its KV cache
(:func:`kv_cache_draft`), one cheap decode step per token. The same forwards (:func:`draft_feeds`) give every step's
logits row on the draft's own sequence (:func:`draft_rows`), which is how two models are compared on one sequence.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.cpu import CpuRuntime, llm_engine_greedy, to_numpy
from mnnbuild.cpu.segments import Segment, plan_segments, run_segmented
from mnnbuild.mnn import embedding_info, load_model, read_embeddings
from mnnbuild.mnn.llm import DEFAULT_MODEL, DEFAULT_WEIGHT, MODEL_CONFIG, causal_mask
from mnnbuild.mnn.summary import op_parameter_count
from mnnbuild_runtime.bundle import bundle_path, check_engine_files, mask_window, read_config
from mnnbuild_runtime.chunks import block_sizes, fit_block
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.hybrid import HybridModel, text_feeds

log = logging.getLogger(__name__)


class Embeddings:
    """Token id -> embedding row, from a model dir's ``llm_config.json`` (tied embeddings inside
    ``llm.mnn.weight``, or ``embeddings_bf16.bin``). Rows are cached, so a growing sequence reads each
    token once."""

    def __init__(self, model_dir: str | os.PathLike[str], *, links: bool = False) -> None:
        """``links``: a fetched model dir, whose files are links to the source model's (`bundle_path`)."""
        self.model_dir = Path(model_dir)
        self.links = links
        self._check_files()
        try:
            self.info = embedding_info(self.model_dir)
        except MNNFormatError as exc:
            raise BundleError(f"{self.model_dir}: cannot locate the token embeddings: {exc}") from exc
        self._check_files()
        self._rows: dict[int, np.ndarray] = {}

    def _check_files(self) -> None:
        """``llm_config.json`` and the file the rows are read from, checked right before each read."""
        bundle_path(self.model_dir, "llm_config.json", f"{self.model_dir}: embeddings", links=self.links)
        info = getattr(self, "info", None)
        if info is not None:
            rel = Path(info.path).relative_to(self.model_dir).as_posix()
            bundle_path(self.model_dir, rel, f"{self.model_dir}: embeddings", links=self.links)

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
            self._check_files()
            try:
                rows = read_embeddings(self.model_dir, todo)
            except MNNFormatError as exc:
                raise BundleError(f"{self.model_dir}: embedding lookup failed: {exc}") from exc
            self._rows.update(zip(todo, rows, strict=True))
        if not ids:
            return np.zeros((0, self.hidden), dtype=np.float32)
        return np.stack([self._rows[t] for t in ids]).astype(np.float32, copy=False)


def llm_inputs(
    embeds: np.ndarray, seq: int | None = None, logits_index: int | None = None, pad: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The four LLM graph inputs for embeddings ``[n, hidden]``, padded to ``seq`` rows with zeros, or with rows
    ``n..seq-1`` of ``pad`` (``[seq, 1, hidden]``; the causal mask keeps them out of the first ``n`` rows).

    ``logits_index`` defaults to -1 (last row only) for one row and 0 (every row) otherwise."""
    n, hidden = embeds.shape
    seq = n if seq is None else seq
    if n > seq:
        raise ValueError(f"{n} embedding rows do not fit in a sequence of {seq}")
    padded = np.zeros((seq, 1, hidden), dtype=np.float32)
    if pad is not None:
        padded[n:] = np.asarray(pad, dtype=np.float32).reshape(seq, 1, hidden)[n:]
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
    stop_reason: str  # "max_new_tokens", "chunk_full", "stop_token", (follow_draft) "draft_rejected" or "cut"
    chunk: int
    step_seconds: list[float] = field(default_factory=list)
    top2_margins: list[float] = field(default_factory=list)
    """Per step, top-1 minus top-2 logit: a small margin makes a divergence from another run expected."""
    rows: list[np.ndarray] = field(default_factory=list, repr=False)
    """Per step, the logits row that picked its token (of the loop's own sequence); not in :meth:`as_dict`."""

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
Redraft = Callable[[list[int], int], Sequence[int]]
"""(the sequence so far, how many tokens at most) -> a guess of the loop's next tokens (may be short or empty)."""


def _logit_rows(outputs: Mapping[str, np.ndarray], size: int) -> np.ndarray:
    logits = np.asarray(outputs["logits"])
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.shape[0] != size:
        raise BundleError(f"logits have {rows.shape[0]} rows for a sequence of {size}; expected one per row")
    return rows


def _pick(result: GenerationResult, row: np.ndarray, seconds: float) -> int:
    """The greedy token of a logits row, appended to ``result`` with its top-2 margin."""
    token = int(np.argmax(row))
    top2 = np.partition(row, -2)[-2:]
    result.top2_margins.append(float(top2[1] - top2[0]))
    result.step_seconds.append(seconds)
    result.tokens.append(token)
    result.rows.append(row.copy())  # a view would keep the whole forward's logits alive
    return token


def recompute_generate(
    forward: ForwardFn,
    embed: Callable[[Sequence[int]], np.ndarray],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    chunk: int | Sequence[int],
    stop_ids: Sequence[int] = (),
) -> GenerationResult:
    """The greedy loop shared by the bundle and the CPU reference (see the module docstring). ``chunk``: the
    one prefill length, or the model's ``chunk_limits`` (each step at the smallest that holds the sequence)."""
    prompt, limits, chunk = _loop_setup(prompt_ids, chunk)
    seq = list(prompt)
    result = GenerationResult(prompt, [], "max_new_tokens", chunk)
    stops = {int(t) for t in stop_ids}
    while len(result.tokens) < max_new_tokens:
        if len(seq) >= chunk:
            result.stop_reason = "chunk_full"
            break
        t0 = time.perf_counter()
        size = chunk if limits is None else fit_block(len(seq), limits)
        rows = _logit_rows(forward(llm_inputs(embed(seq), size, logits_index=0)), size)
        token = _pick(result, rows[len(seq) - 1], time.perf_counter() - t0)
        seq.append(token)
        if token in stops:
            result.stop_reason = "stop_token"
            break
    log.info("generated %d tokens (%s)", len(result.tokens), result.stop_reason)
    return result


def _loop_setup(prompt_ids: Sequence[int], chunk: int | Sequence[int]) -> tuple[list[int], list[int] | None, int]:
    """The prompt as ints, the ``chunk_limits`` (None: one length) and the largest length; a prompt that is
    empty or longer than the largest length is refused."""
    limits = None if isinstance(chunk, int) else list(chunk)
    largest = chunk if isinstance(chunk, int) else block_sizes(chunk)[-1]
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("empty prompt")
    if len(prompt) > largest:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit the prefill chunk of {largest}")
    return prompt, limits, largest


@dataclass(frozen=True)
class _DraftPlan:
    """The loop's steps over prompt + draft: each step's length, and per length the longest prefix run at it (its
    rows hold every shorter prefix's at that length)."""

    prompt: list[int]
    guess: list[int]
    limits: list[int] | None
    chunk: int
    sizes: list[int]
    longest: dict[int, int]

    @classmethod
    def of(
        cls, prompt_ids: Sequence[int], draft: Sequence[int], max_new_tokens: int, chunk: int | Sequence[int]
    ) -> _DraftPlan:
        prompt, limits, largest = _loop_setup(prompt_ids, chunk)
        room = min(max_new_tokens, largest - len(prompt))
        guess = [int(t) for t in draft][: max(room, 0)]
        # the draft's steps and the one after it (the first the draft does not guess), while the loop would run
        steps = max(min(len(guess) + 1, room), 0)
        sizes = [largest if limits is None else fit_block(len(prompt) + i, limits) for i in range(steps)]
        longest = {size: len(prompt) + i for i, size in enumerate(sizes)}
        return cls(prompt, guess, limits, largest, sizes, longest)

    def feed(
        self, embed: Callable[[Sequence[int]], np.ndarray], size: int, pad: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        return llm_inputs(embed((self.prompt + self.guess)[: self.longest[size]]), size, logits_index=0, pad=pad)


def draft_feeds(
    embed: Callable[[Sequence[int]], np.ndarray],
    prompt_ids: Sequence[int],
    draft: Sequence[int],
    max_new_tokens: int,
    chunk: int | Sequence[int],
    pads: Mapping[int, np.ndarray] | None = None,
) -> dict[int, dict[str, np.ndarray]]:
    """The forwards :func:`follow_draft` makes, by prefill length (one per length the loop uses for the draft's
    steps), for a caller that runs them itself (with other inputs, say) and passes their ``logits`` back.
    ``pads``: by length, ``input_ids`` whose rows after the sequence pad it instead of zeros (see
    :func:`llm_inputs`), so that the forward can serve another check too."""
    plan = _DraftPlan.of(prompt_ids, draft, max_new_tokens, chunk)
    return {size: plan.feed(embed, size, (pads or {}).get(size)) for size in plan.longest}


def draft_rows(
    logits: Mapping[int, np.ndarray], prompt_ids: Sequence[int], draft: Sequence[int], chunk: int | Sequence[int]
) -> list[np.ndarray]:
    """Per token of ``draft``, the logits row that picks it in the loop (its prefix, at its length), from the
    ``logits`` of :func:`draft_feeds`' forwards (by length; every draft token's length must be there)."""
    plan = _DraftPlan.of(prompt_ids, draft, len(draft), chunk)
    start = len(plan.prompt) - 1
    rows = {size: _logit_rows({"logits": logits[size]}, size) for size in plan.longest if size in logits}
    missing = sorted(set(plan.sizes[: len(plan.guess)]) - set(rows))
    if missing:
        raise BundleError(f"no logits for prefill lengths {missing} of the draft's steps")
    return [rows[size][start + i] for i, size in enumerate(plan.sizes[: len(plan.guess)])]


@dataclass
class DraftOutcome:
    result: GenerationResult
    """The greedy loop's tokens (as :func:`recompute_generate` gives them)."""
    step_rows: list[np.ndarray]
    """Per draft step, the logits row that picks it in the loop (its prefix, at its length): for every step when
    the draft holds or all lengths' ``logits`` were given, else up to the first wrong one."""
    rejected: int | None
    """The first draft step whose token is not the greedy one (None: the draft holds, as far as it goes)."""
    forwards: int
    """Forwards this call ran (given ``logits`` not counted)."""


def follow_draft(
    forward: ForwardFn,
    embed: Callable[[Sequence[int]], np.ndarray],
    prompt_ids: Sequence[int],
    draft: Sequence[int],
    max_new_tokens: int,
    chunk: int | Sequence[int],
    stop_ids: Sequence[int] = (),
    *,
    logits: Mapping[int, np.ndarray] | None = None,
    redraft: Redraft | None = None,
    follow: bool = True,
) -> DraftOutcome:
    """:func:`recompute_generate`'s tokens, found from a guess (see the module docstring): one forward per length
    the loop uses over prompt + ``draft`` confirms the draft up to its first wrong token and gives the right one;
    from there (or from the draft's end) the loop runs as usual, or, given ``redraft``, goes on the same way from
    a new guess for the sequence so far (so a wrong token costs one more round, not a forward per later token).
    ``logits``: those forwards' outputs by length when already computed (of :func:`draft_feeds`).
    ``follow=False``: stop at the first wrong draft token (the right one is the last token returned, stop reason
    ``draft_rejected``); no forward past the draft's own."""
    plan = _DraftPlan.of(prompt_ids, draft, max_new_tokens, chunk)
    prompt, guess = plan.prompt, plan.guess
    rows = {size: _logit_rows({"logits": v}, size) for size, v in (logits or {}).items()}
    forwards = 0

    def row(i: int) -> np.ndarray:
        nonlocal forwards
        size = plan.sizes[i]
        if size not in rows:
            rows[size] = _logit_rows(forward(plan.feed(embed, size)), size)
            forwards += 1
        return rows[size][len(prompt) - 1 + i]

    result = GenerationResult(prompt, [], "max_new_tokens", plan.chunk)
    outcome = DraftOutcome(result, [], None, 0)
    stops = {int(t) for t in stop_ids}
    for i in range(len(plan.sizes) + 1):
        if len(result.tokens) >= max_new_tokens:
            break
        if len(prompt) + i >= plan.chunk:
            result.stop_reason = "chunk_full"
            break
        t0 = time.perf_counter()
        step_row = row(i)
        if i < len(guess):
            outcome.step_rows.append(step_row)
        token = _pick(result, step_row, time.perf_counter() - t0)
        if token in stops:
            result.stop_reason = "stop_token"
            break
        if i < len(guess) and token == guess[i]:
            continue
        outcome.rejected = i if i < len(guess) else None
        # the rows already at hand of the draft's later steps (on the draft's sequence), for the caller to compare
        outcome.step_rows += [
            rows[plan.sizes[j]][len(prompt) - 1 + j] for j in range(i + 1, len(guess)) if plan.sizes[j] in rows
        ]
        if not follow and outcome.rejected is not None:
            result.stop_reason = "draft_rejected"
            break
        seq, left, chunk_arg = prompt + result.tokens, max_new_tokens - len(result.tokens), plan.limits or plan.chunk
        if redraft is None:
            rest = recompute_generate(forward, embed, seq, left, chunk_arg, stop_ids)
            forwards += len(rest.tokens)
        else:  # a new guess from here: a round costs one forward per length and gives at least one token
            guess_more = redraft(seq, min(left, plan.chunk - len(seq))) if left > 0 and len(seq) < plan.chunk else []
            more = follow_draft(forward, embed, seq, guess_more, left, chunk_arg, stop_ids, redraft=redraft)
            rest = more.result
            forwards += more.forwards
        result.tokens += rest.tokens
        result.top2_margins += rest.top2_margins
        result.step_seconds += rest.step_seconds
        result.rows += rest.rows
        result.stop_reason = rest.stop_reason
        break
    outcome.forwards = forwards
    return outcome


def greedy_generate(
    model: HybridModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    stop_ids: Sequence[int] = (),
    embeddings: Embeddings | None = None,
) -> GenerationResult:
    """Greedy tokens from the bundle, each step at the smallest of its ``chunk_limits`` that holds the sequence."""
    embed = embeddings or Embeddings(model.bundle.model_dir)
    return recompute_generate(model.forward, embed, prompt_ids, max_new_tokens, model.bundle.block_sizes, stop_ids)


def _original_model_file(model_dir: Path) -> tuple[Path, Path | None]:
    config_path = model_dir / MODEL_CONFIG
    llm_model, llm_weight = DEFAULT_MODEL, DEFAULT_WEIGHT
    if config_path.is_file():
        config = read_config(config_path, links=True)
        llm_model = config.get("llm_model", llm_model)
        llm_weight = config.get("llm_weight", llm_weight)
    # the original model dir: fetched, its files are links to the source model's
    model_file = bundle_path(model_dir, llm_model, f"{config_path}: field 'llm_model'", links=True)
    weight_file = bundle_path(model_dir, llm_weight, f"{config_path}: field 'llm_weight'", links=True)
    if not model_file.is_file():
        raise BundleError(f"{model_dir}: model file {model_file} does not exist")
    return model_file, weight_file if weight_file.is_file() else None


def cpu_forward_fn(model_dir: str | os.PathLike[str], runtime: CpuRuntime | None = None) -> ForwardFn:
    """A forward function running the ORIGINAL model dir's ``llm.mnn`` in MNN on the CPU: the whole graph, in
    segments of bounded weight (:mod:`mnnbuild.cpu.segments`), so a real-size model never sits in memory
    decoded to fp32 all at once; the results are the whole module's, bit for bit. A text prompt's feeds are
    completed for a VL model's inputs and the mask MNN's engine builds for the model's attention kinds
    (:func:`~mnnbuild_runtime.hybrid.text_feeds`)."""
    model_dir = Path(model_dir)
    model_file, weight_file = _original_model_file(model_dir)
    config_path = model_dir / MODEL_CONFIG
    window = mask_window(config_path, read_config(config_path, links=True) if config_path.is_file() else {}, links=True)
    rt = (runtime or CpuRuntime()).create(weight_file)
    model = load_model(model_file)
    in_names, out_names = model.input_names, model.output_names
    declared = model.input_dims
    plan: list[Segment] | None = None  # every forward feeds the same inputs for the same outputs: planned once

    def forward(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        nonlocal plan
        inputs = text_feeds(inputs, declared, window)
        if plan is None:
            plan = plan_segments(
                model, [model.tensor_index(n) for n in in_names], [model.tensor_index(n) for n in out_names]
            )
        feed = {n: np.ascontiguousarray(inputs[n]) for n in in_names}
        (outs,) = run_segmented(model_file, rt, model, [feed], out_names, segments=plan)
        return {n: to_numpy(v) for n, v in outs.items()}

    return forward


DRAFT_LOW_MEMORY_ABOVE = 1 << 30
"""fp32 bytes of decoded weights above which the draft keeps quantized weights as stored (MNN's ``memory: low``)."""


def kv_cache_draft(
    model_dir: str | os.PathLike[str],
    prompt_ids: Sequence[int],
    n: int,
    runtime: CpuRuntime | None = None,
    *,
    low_memory_above: int = DRAFT_LOW_MEMORY_ABOVE,
    rows: list[np.ndarray] | None = None,
) -> list[int]:
    """``n`` greedy tokens of the ORIGINAL model dir from MNN's own LLM engine with its KV cache
    (:func:`mnnbuild.cpu.llm_engine_greedy`), with ``runtime``'s backend, precision and threads. A guess for
    :func:`follow_draft`: fast, but other arithmetic than the prefill-shape loop's, so a close call may go the
    other way. ``[]`` when the engine cannot run the model. ``rows``: the engine's logits row of each token is
    appended to it (nothing when it gives no tokens)."""
    config = Path(model_dir) / MODEL_CONFIG
    if n <= 0 or not config.is_file():
        return []
    # MNN's engine reads every file it names: a name leading out is an error, not a warning
    check_engine_files(config, read_config(config, links=True), links=True)
    rt = runtime or CpuRuntime()
    model_file, _ = _original_model_file(Path(model_dir))
    decoded = 4 * sum(op_parameter_count(op) for op in load_model(model_file).ops)
    settings = {
        "backend_type": rt.backend.lower(),
        "thread_num": rt.threads(),
        "precision": rt.precision,
        # "normal" decodes every quantized weight to fp32 (GBs for Qwen3-1.7B). A big model's draft keeps them as
        # stored: in a fraction of the memory and time (docs/benchmarks.md). Its arithmetic differs, so close calls
        # may go another way (the int8 fixture's at token 8; a 2-layer model of Qwen3-1.7B's dims twice in 16 tokens,
        # on leads of 0.5-0.9% of the row's max |logit|): that costs confirming forwards, never tokens.
        "memory": "low" if decoded > low_memory_above else "normal",
        "sampler_type": "greedy",
    }
    found: list[np.ndarray] = []
    try:
        tokens = llm_engine_greedy(config, prompt_ids, n, settings, found)
    except Exception as exc:  # only a guess: without it the reference is slower, not wrong
        log.warning("%s: no KV-cache draft (%s); the reference recomputes the prefill per token", config, exc)
        return []
    if rows is not None:
        rows += found
    return tokens


def kv_cache_redraft(model_dir: str | os.PathLike[str], runtime: CpuRuntime | None = None) -> Redraft:
    """:func:`kv_cache_draft` from any sequence, for :func:`follow_draft`'s ``redraft``: after a wrong guess, MNN's
    engine guesses again from the loop's own tokens."""
    return lambda seq, n: kv_cache_draft(model_dir, seq, n, runtime)


def loop_redraft(
    forward: ForwardFn,
    embed: Callable[[Sequence[int]], np.ndarray],
    chunk: int | Sequence[int],
    guess: Redraft | None = None,
) -> Redraft:
    """Another model's greedy loop as the guess (``forward``'s recompute loop, found from ``guess``'s guesses):
    when one forward of the model being followed costs many of ``forward``'s (a bundle in the x86 simulator against
    the original model on the CPU), the cheap loop's tokens are the better guess, since the two agree but on
    near-ties."""

    def redraft(seq: list[int], n: int) -> list[int]:
        if n <= 0:
            return []
        first = guess(seq, n) if guess is not None else []
        return follow_draft(forward, embed, seq, first, n, chunk, redraft=guess).result.tokens

    return redraft


def cpu_greedy_generate(
    model_dir: str | os.PathLike[str],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    chunk: int | Sequence[int],
    stop_ids: Sequence[int] = (),
    runtime: CpuRuntime | None = None,
) -> GenerationResult:
    """The reference: the recompute loop's tokens on the original model dir, ``llm.mnn`` whole in MNN CPU, found
    by :func:`follow_draft` from :func:`kv_cache_draft`'s guess (about one forward per prefill length instead of
    one per token)."""
    prompt, _, largest = _loop_setup(prompt_ids, chunk)
    redraft = kv_cache_redraft(model_dir, runtime)
    outcome = follow_draft(cpu_forward_fn(model_dir, runtime), Embeddings(model_dir, links=True), prompt,
                           redraft(prompt, min(max_new_tokens, largest - len(prompt))), max_new_tokens, chunk,
                           stop_ids, redraft=redraft)  # fmt: skip
    if outcome.rejected is not None:
        log.info("MNN's KV-cache tokens part from the recompute loop's at step %d", outcome.rejected)
    return outcome.result
