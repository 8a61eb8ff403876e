"""The generation check's CPU reference, beside the simulator pass.

The reference is the original model's greedy tokens in MNN on the CPU: MNN's KV-cache engine guesses them (the
draft, one cheap decode step per token), and a forward per prefill length the recompute loop uses confirms them
(`mnnbuild_runtime.follow_draft`); an io sample that serves the generation's forward too needs the original
model's outputs for its new inputs, one more forward. At Qwen3-1.7B size those forwards take minutes, and the
simulator pass does not need them: only the sequence it runs on, which is the draft's wherever MNN's two
arithmetics agree (they part on near-ties only). So a big model's reference runs in a child process
(:class:`ChildReference`; MNN holds the GIL through a forward, a thread would stall the simulator loop): it sends
the draft as soon as it has it, the pass runs on it, and the confirming forwards run beside the pass. Where the
confirmed tokens are not the draft's, the lengths the pass ran on the draft's sequence run again after it
(``GenerationRun.take_reference``). A small model's reference takes less time than a process takes to start: it
runs here, whole, before the pass (:class:`InProcessReference`), the same steps (:class:`ReferenceWork`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np
from mnnbuild_runtime import Embeddings, Tokenizer, cpu_forward_fn, follow_draft, kv_cache_draft, kv_cache_redraft
from mnnbuild_runtime.generate import ForwardFn

from mnnbuild.base.child import Channel, Child
from mnnbuild.base.errors import MnnbuildError, SpecError
from mnnbuild.cpu import CpuRuntime
from mnnbuild.pipeline.layout import CONFIG_FILE

log = logging.getLogger(__name__)

CHILD_ABOVE = 32 << 20
"""Bytes of the original model's files above which the reference runs in a child process, beside the pass: below,
it takes less time than a child process takes to start (imports)."""


def describe_error(exc: BaseException) -> str:
    # MNN raises bare RuntimeError/SystemError; keep the type so a bug is not mistaken for a bad bundle
    return str(exc) if isinstance(exc, MnnbuildError) else f"{type(exc).__name__}: {exc}"


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
    """What the reference computes: the original model dir's greedy tokens for the bundle's prompt."""

    model_dir: Path
    bundle_dir: Path
    """The bundle's model dir: its tokenizer encodes the prompt."""
    limits: list[int]
    prompt: str
    max_new_tokens: int
    runtime: CpuRuntime


@dataclass
class Draft:
    """The sequence the simulator pass runs the generation on: the prompt's ids and tokens after it."""

    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    confirmed: bool = False
    """The tokens are the reference's own (it ran whole first), not MNN's KV-cache guess."""
    problem: str | None = None


@dataclass
class Reference:
    """The CPU's greedy tokens, the logits row that picked each, and the original model's outputs for the shared io
    samples' inputs (by prefill length)."""

    tokens: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    rejected: int | None = None
    """The first draft token the confirming forwards did not keep (None: the draft held)."""
    outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """``start`` (a child process's, until it runs), ``draft``, ``confirm``, ``shared``: where its time went."""
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
        self._forward: ForwardFn | None = None

    def _failed(self, what: str, exc: BaseException) -> None:
        log.debug("generation reference: %s failed", what, exc_info=True)
        self.reference.problem = self.draft_.problem = describe_error(exc)

    def draft(self) -> Draft:
        """The prompt's ids and MNN's KV-cache tokens after it."""
        spec, t0 = self.spec, time.perf_counter()
        try:
            ids = Tokenizer(spec.bundle_dir / CONFIG_FILE).encode(spec.prompt)
            chunk = max(spec.limits)
            self.draft_.prompt_ids = ids
            steps = min(spec.max_new_tokens, chunk - len(ids))
            if steps <= 0:
                raise SpecError(f"prompt {spec.prompt!r} has {len(ids)} tokens; no room left in the chunk of {chunk}")
            self.draft_.tokens = kv_cache_draft(spec.model_dir, ids, steps, spec.runtime)
        except Exception as exc:
            self._failed("the draft", exc)
        self.reference.seconds["draft"] = time.perf_counter() - t0
        return self.draft_

    def confirm(self) -> None:
        """The recompute loop's tokens, found from the draft (a forward per prefill length; a new guess after a wrong
        token)."""
        spec, ref, t0 = self.spec, self.reference, time.perf_counter()
        if ref.problem is not None:
            return
        try:
            self._forward = forward = cpu_forward_fn(spec.model_dir, self.beside)
            ids = self.draft_.prompt_ids
            steps = min(spec.max_new_tokens, max(spec.limits) - len(ids))
            cpu = follow_draft(
                forward, Embeddings(spec.model_dir, links=True), ids, self.draft_.tokens, steps, spec.limits,
                redraft=kv_cache_redraft(spec.model_dir, self.beside),
            )  # fmt: skip
            if cpu.rejected is not None:
                log.debug("verify: MNN's KV-cache tokens %s part from the recompute loop's %s at step %d; the loop's "
                          "count", self.draft_.tokens, cpu.result.tokens, cpu.rejected)  # fmt: skip
            ref.tokens, ref.rows, ref.rejected = list(cpu.result.tokens), cpu.result.rows, cpu.rejected
        except Exception as exc:
            self._failed("the confirming forwards", exc)
        ref.seconds["confirm"] = time.perf_counter() - t0

    def shared(self, feeds: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        """The original model's outputs for each shared io sample's inputs (by prefill length)."""
        ref, t0 = self.reference, time.perf_counter()
        if ref.problem is not None or not feeds:
            return
        try:
            forward = self._forward or cpu_forward_fn(self.spec.model_dir, self.beside)
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
    """The reference in this process: whole at :meth:`draft` (so the pass runs on the confirmed tokens), the shared
    samples' forwards at :meth:`result` (after the pass: the simulator's contexts are freed by then)."""

    def __init__(self, spec: ReferenceSpec) -> None:
        self.work = ReferenceWork(spec)
        self._feeds: Mapping[int, Mapping[str, np.ndarray]] = {}

    def draft(self) -> Draft:
        draft = self.work.draft()
        self.work.confirm()
        if self.work.reference.problem is None:
            draft = Draft(draft.prompt_ids, list(self.work.reference.tokens), True)
        else:
            draft = Draft(draft.prompt_ids, [], problem=self.work.reference.problem)
        return draft

    def send_shared(self, feeds: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        self._feeds = feeds

    def result(self) -> Reference:
        self.work.shared(self._feeds)
        return self.work.reference


def beside_runtime(runtime: CpuRuntime) -> CpuRuntime:
    """``runtime`` with a thread fewer than this process may use, at most its own count and at least one: the
    simulator runs on one core (its pass keeps it), and MNN's threads split work by output, so the values are the
    same with any count (`CpuRuntime.num_thread`)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return runtime.model_copy(update={"num_thread": max(1, min(runtime.num_thread, cpus - 1))})


def _reference_child(channel: Channel, spec: ReferenceSpec, spawned: float) -> Reference:
    """The child process: the draft sent at once (all threads: the requester reads and checks binaries meanwhile),
    then the confirming forwards and the shared samples', beside the simulator (`beside_runtime`).
    ``spawned``: ``time.monotonic()`` when the requester started it (one clock for every process of the machine)."""
    work = ReferenceWork(spec, beside_runtime(spec.runtime))
    work.reference.seconds["start"] = time.monotonic() - spawned
    channel.send(work.draft())
    work.confirm()
    work.shared(channel.recv())
    return work.reference


class ChildReference(ReferenceJob):
    """The reference in a child process that dies with this one (`mnnbuild.base.child`), started at once: the pass
    can run on its draft while it confirms it."""

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
