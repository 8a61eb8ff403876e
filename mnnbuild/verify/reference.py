"""The generation check's CPU reference, beside the simulator pass.

The generation runs on MNN's own greedy tokens: those of its LLM engine with its KV cache (the draft, one cheap
decode step per token), what MNN itself generates on the CPU. The reference for each step is the original model's
recompute forward on that same sequence (one forward per prefill length the steps use, `mnnbuild_runtime.draft_rows`:
row ``i`` sees tokens ``0..i`` only), the rows the bundle's pass is compared with; where its argmax is not the
draft's token, MNN's two CPU arithmetics part (``GenerationRun.conclude`` judges it). An io sample that serves the
generation's forward too needs the original model's outputs for its new inputs, one more forward. At Qwen3-1.7B size
those forwards take minutes, and the simulator pass needs only the sequence: a big model's reference runs in a child
process (:class:`ChildReference`; MNN holds the GIL through a forward, a thread would stall the simulator loop) that
sends the draft as soon as it has it, and runs the forwards beside the pass. A small model's reference takes less
time than a process takes to start: it runs here (:class:`InProcessReference`), the draft before the pass and the
forwards after it, the same steps (:class:`ReferenceWork`).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np
from mnnbuild_runtime import (
    Embeddings,
    Tokenizer,
    cpu_forward_fn,
    draft_feeds,
    draft_rows,
    kv_cache_draft,
    recompute_generate,
)
from mnnbuild_runtime.generate import ForwardFn

from mnnbuild.base.child import Channel, Child
from mnnbuild.base.errors import MnnbuildError, SpecError, error_line
from mnnbuild.cpu import CpuRuntime, usable_cpus
from mnnbuild.pipeline.layout import CONFIG_FILE

log = logging.getLogger(__name__)

CHILD_ABOVE = 32 << 20
"""Bytes of the original model's files above which the reference runs in a child process, beside the pass: below,
it takes less time than a child process takes to start (imports)."""


def describe_error(exc: BaseException) -> str:
    # MNN raises bare RuntimeError/SystemError; keep the type so a bug is not mistaken for a bad bundle
    return str(exc) if isinstance(exc, MnnbuildError) else error_line(exc)


def model_bytes(model_dir: Path) -> int:
    """The size of a fetched model dir's files (its links followed): what the reference's cost grows with."""
    total = 0
    for p in Path(model_dir).iterdir():
        try:
            total += p.stat().st_size if p.is_file() else 0
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class ReferenceSpec:
    """What the reference computes: MNN's greedy tokens of the original model dir for the bundle's prompt, and its
    recompute logits rows on them."""

    model_dir: Path
    bundle_dir: Path
    """The bundle's model dir: its tokenizer encodes the prompt."""
    limits: list[int]
    prompt: str
    max_new_tokens: int
    runtime: CpuRuntime


@dataclass
class Draft:
    """The sequence the generation runs on: the prompt's ids and MNN's greedy tokens after it."""

    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    from_engine: bool = True
    """The tokens are MNN's KV-cache engine's; False: the engine cannot run the model, and (some of) the tokens are
    the recompute loop's (one forward per token)."""
    problem: str | None = None


@dataclass
class Reference:
    """Per draft token, the original model's recompute logits row for its prefix (and the engine's own row); and its
    outputs for the shared io samples' inputs (by prefill length)."""

    rows: list[np.ndarray] = field(default_factory=list)
    engine_rows: list[np.ndarray] = field(default_factory=list)
    """Per draft token from MNN's engine, the engine's own logits row that picked it."""
    outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """``start`` (a child process's, until it runs), ``draft``, ``confirm`` (the recompute forwards on the draft),
    ``shared``: where its time went."""
    problem: str | None = None


class ReferenceWork:
    """The reference's steps, in whichever process runs them: :meth:`draft`, :meth:`confirm`, :meth:`shared`. A
    failed step records its problem in :attr:`reference` (and the later steps do nothing)."""

    def __init__(self, spec: ReferenceSpec, beside: CpuRuntime | None = None) -> None:
        """``beside``: the runtime of the forwards after the draft (fewer threads beside the simulator)."""
        self.spec = spec
        self.beside = beside or spec.runtime
        self.draft_ = Draft()
        self.reference = Reference()
        self._cpu: tuple[ForwardFn, Embeddings] | None = None

    def _failed(self, what: str, exc: BaseException) -> None:
        log.debug("generation reference: %s failed", what, exc_info=True)
        self.reference.problem = self.draft_.problem = describe_error(exc)

    def _model(self) -> tuple[ForwardFn, Embeddings]:
        """The original model's recompute forward and its embeddings, made once."""
        if self._cpu is None:
            self._cpu = (cpu_forward_fn(self.spec.model_dir, self.beside), Embeddings(self.spec.model_dir, links=True))
        return self._cpu

    def draft(self) -> Draft:
        """The prompt's ids and MNN's KV-cache tokens after it; where the engine gives none, the recompute loop's."""
        spec, t0 = self.spec, time.perf_counter()
        try:
            ids = Tokenizer(spec.bundle_dir / CONFIG_FILE).encode(spec.prompt)
            chunk = max(spec.limits)
            self.draft_.prompt_ids = ids
            steps = min(spec.max_new_tokens, chunk - len(ids))
            if steps <= 0:
                raise SpecError(f"prompt {spec.prompt!r} has {len(ids)} tokens; no room left in the chunk of {chunk}")
            tokens = kv_cache_draft(spec.model_dir, ids, steps, spec.runtime, rows=self.reference.engine_rows)
            if len(tokens) < steps:  # the engine cannot run this model: slower, not wrong
                forward, embed = self._model()
                tokens += recompute_generate(forward, embed, ids + tokens, steps - len(tokens), spec.limits).tokens
                self.draft_.from_engine = False
            self.draft_.tokens = tokens
        except Exception as exc:
            self._failed("the draft", exc)
        self.reference.seconds["draft"] = time.perf_counter() - t0
        return self.draft_

    def confirm(self) -> None:
        """The recompute forwards on the draft (one per prefill length its steps use): per draft token, the row of
        its prefix, the reference's logits and pick for that step."""
        spec, ref, t0 = self.spec, self.reference, time.perf_counter()
        if ref.problem is not None:
            return
        try:
            forward, embed = self._model()
            ids, tokens = self.draft_.prompt_ids, self.draft_.tokens
            feeds = draft_feeds(embed, ids, tokens, len(tokens), spec.limits)
            ref.rows = draft_rows({size: forward(feed)["logits"] for size, feed in feeds.items()}, ids, tokens,
                                  spec.limits)  # fmt: skip
        except Exception as exc:
            self._failed("the recompute forwards", exc)
        ref.seconds["confirm"] = time.perf_counter() - t0

    def shared(self, feeds: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        """The original model's outputs for each shared io sample's inputs (by prefill length)."""
        ref, t0 = self.reference, time.perf_counter()
        if ref.problem is not None or not feeds:
            return
        try:
            forward, _ = self._model()
            ref.outputs = {size: {k: np.asarray(v) for k, v in forward(feed).items()} for size, feed in feeds.items()}
        except Exception as exc:
            self._failed("the shared samples' forwards", exc)
        ref.seconds["shared"] = time.perf_counter() - t0


class ReferenceJob:
    """The reference running somewhere: :meth:`draft` (what the pass runs on), :meth:`send_shared` (the shared io
    samples' inputs), :meth:`result` (the rest); in a ``with``, so that whatever runs it ends with it."""

    beside = False
    """It runs beside this process's work (a child process)."""

    def draft(self) -> Draft:
        raise NotImplementedError

    def send_shared(self, feeds: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        raise NotImplementedError

    def result(self) -> Reference:
        raise NotImplementedError

    def close(self) -> None:
        """End what runs it (nothing, in this process)."""

    def __enter__(self) -> ReferenceJob:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class InProcessReference(ReferenceJob):
    """The reference in this process: the draft at :meth:`draft`, the forwards at :meth:`result` (after the pass:
    the simulator's contexts are freed by then)."""

    def __init__(self, spec: ReferenceSpec) -> None:
        self.work = ReferenceWork(spec)
        self._feeds: Mapping[int, Mapping[str, np.ndarray]] = {}

    def draft(self) -> Draft:
        return self.work.draft()

    def send_shared(self, feeds: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        self._feeds = feeds

    def result(self) -> Reference:
        self.work.confirm()
        self.work.shared(self._feeds)
        return self.work.reference


def beside_runtime(runtime: CpuRuntime) -> CpuRuntime:
    """``runtime`` with a thread fewer than this process may use, at most its own count and at least one: the
    simulator runs on one core (its pass keeps it), and MNN's threads split work by output, so the values are the
    same with any count (`CpuRuntime.num_thread`)."""
    return runtime.model_copy(update={"num_thread": max(1, min(runtime.num_thread, usable_cpus() - 1))})


def _reference_child(channel: Channel, spec: ReferenceSpec, spawned: float) -> Reference:
    """The child process: the draft sent at once (all threads: the requester reads and checks binaries meanwhile),
    then the recompute forwards on it and the shared samples', beside the simulator (`beside_runtime`).
    ``spawned``: ``time.monotonic()`` when the requester started it (one clock for every process of the machine)."""
    work = ReferenceWork(spec, beside_runtime(spec.runtime))
    work.reference.seconds["start"] = time.monotonic() - spawned
    channel.send(work.draft())
    work.confirm()
    work.shared(channel.recv())
    return work.reference


class ChildReference(ReferenceJob):
    """The reference in a child process that dies with this one (`mnnbuild.base.child`), started at once: the pass
    runs on its draft while it runs the recompute forwards on the same sequence."""

    beside = True

    def __init__(self, spec: ReferenceSpec) -> None:
        # spawned, not forked: this process may hold QNN contexts and threads; not the compose forkserver either,
        # whose preloads are the lowering's
        spawn = multiprocessing.get_context("spawn")
        self._child = Child(spawn, _reference_child, (spec, time.monotonic()), "CPU reference")
        self._sent = False

    def draft(self) -> Draft:
        try:
            return self._child.recv()
        except Exception as exc:  # a failed or killed child: the generation check's problem
            return Draft(problem=f"the CPU reference: {describe_error(exc)}")

    def send_shared(self, feeds: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        try:
            self._child.send(dict(feeds))
            self._sent = True
        except OSError as exc:
            log.debug("the CPU reference process is gone: %s", exc)

    def result(self) -> Reference:
        if not self._sent:
            self.send_shared({})
        try:
            return self._child.result()
        except Exception as exc:
            return Reference(problem=f"the CPU reference: {describe_error(exc)}")

    def close(self) -> None:
        self._child.stop(timeout=0.0)  # it has nothing left to do once it sent its result


def start_reference(spec: ReferenceSpec, in_child: bool | None = None) -> ReferenceJob:
    """The reference for ``spec``: in a child process beside the pass when ``in_child`` (None: when the model is
    over :data:`CHILD_ABOVE`), else here."""
    if in_child is None:
        in_child = model_bytes(spec.model_dir) > CHILD_ABOVE
    return ChildReference(spec) if in_child else InProcessReference(spec)
