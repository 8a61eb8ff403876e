"""Speculative greedy decoding without a host KV cache: an Eagle3 drafter on the CPU and the loop that confirms it.

MNN's engine speculates with an Eagle3 draft (``speculative_type = "eagle"`` in the model's config): the target's
``hidden_states`` output (three tapped layers, ``[seq, 3 * hidden]``) goes through ``eagle_fc.mnn`` to the draft's
width, ``eagle.mnn`` (one decoder layer and a head over the draft vocabulary) proposes tokens from it and the token
embeddings, ``eagle_d2t.mnn`` maps a draft id ``d`` to the target id ``d + d2t[d]``. ``eagle_topk`` candidates per
node and ``eagle_depth`` levels make a token tree, of which the ``draft_predict_length`` best nodes are verified by
the target in one forward. Greedy speculation is lossless: the tokens are the target's own greedy ones.

Here (:class:`EagleDrafter`) the draft runs in PyPI MNN like the runtime's other CPU code. This runtime keeps no KV
cache, so each draft forward recomputes the whole sequence plus the tree so far (one decoder layer: cheap next to the
target); its rows pair the target's hidden row of position ``p`` with the embedding of token ``p + 1``, at position
``p``, as the engine's do, and a tree node's row pairs the draft's own output row of its parent with the node's
token. One difference from the engine (``eagle.cpp`` 4d40bdbd, ``topkGenerate``): below the first level the engine
feeds each new active node the output row of the *previous* level's node in the same slot, not of its own parent;
here it is its parent's (they differ only at ``eagle_topk > 1``, where the slots get reordered).

The loop (:func:`speculative_generate`) runs over any forward (the original model on the CPU,
:func:`~mnnbuild_runtime.generate.cpu_forward_fn`, or a bundle's ``HybridModel.forward``): each round the drafter
proposes a chain and :func:`~mnnbuild_runtime.generate.follow_draft` confirms it the way it confirms any guess, one
forward per prefill length over the sequence plus the chain, up to its first wrong token, plus the target's own token
there. With the causal mask those rows are bit for bit the plain loop's (:func:`recompute_generate`), so the tokens
are the plain greedy tokens by construction, whatever the draft proposes; the draft decides only how many tokens a
forward yields. The tree (``eagle_topk > 1``) is what the engine verifies on the phone; :meth:`DraftTree.inputs` gives
that forward's tokens, tree mask and positions (verify's tree-shaped sample), and the loop confirms the tree's best
path as a chain.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.base.native import native_output
from mnnbuild.cpu import (
    CpuRuntime,
    forward_vars,
    import_mnn,
    load_module,
    return_freed_memory,
    to_numpy,
    to_var,
    usable_cpus,
)
from mnnbuild.mnn.llm import (
    EAGLE,
    EAGLE_FILE_FIELDS,
    EAGLE_GRAPH_IO,
    EAGLE_TREE_DEFAULTS,
    EAGLE_TREE_MAX,
    LOOKAHEAD,
    MODEL_CONFIG,
    SPECULATIVE_TYPE,
    draft_length,
    read_draft_map,
)
from mnnbuild_runtime.bundle import bundle_path, check_engine_files, read_config
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.generate import (
    Embeddings,
    ForwardFn,
    GenerationResult,
    _DraftPlan,
    _loop_setup,
    follow_draft,
)

log = logging.getLogger(__name__)

LOWEST = float(np.finfo(np.float32).min)
"""What a masked attention entry holds (MNN's engine writes the lowest float)."""


@dataclass(frozen=True)
class SpeculationConfig:
    """The speculative fields of a model's config (``llmconfig.hpp``'s names and defaults)."""

    kind: str
    """``speculative_type``: "eagle", "lookahead", ..."""
    draft_length: int
    """``draft_predict_length``: draft tokens verified per target forward (that forward has one row more)."""
    topk: int = 1
    depth: int = 3
    eagle_model: Path | None = None
    eagle_fc: Path | None = None
    eagle_d2t: Path | None = None

    @property
    def verify_length(self) -> int:
        """The rows of the engine's verifying forward: the sampled token and the draft."""
        return self.draft_length + 1


def _positive(config_path: Path, config: Mapping[str, Any], key: str, default: int, most: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most is not None and value > most):
        bound = f" at most {most}" if most is not None else ""
        raise BundleError(f"{config_path}: field {key!r} must be a positive int{bound}, got {value!r}")
    return value


def speculation_config(config_path: str | os.PathLike[str], *, links: bool = False) -> SpeculationConfig | None:
    """The speculation a model's config asks for (None: none). An Eagle model's draft files must be files of its
    directory. ``links``: a fetched model dir (see :func:`~mnnbuild_runtime.bundle.bundle_path`)."""
    config_path = Path(config_path)
    config = read_config(config_path, links=links)
    kind = config.get(SPECULATIVE_TYPE, "")
    if kind in ("", None):
        return None
    if not isinstance(kind, str):
        raise BundleError(f"{config_path}: field {SPECULATIVE_TYPE!r} must be a string, got {kind!r}")
    try:
        length = draft_length(config, config_path)
    except ValueError as exc:
        raise BundleError(str(exc)) from None
    if kind != EAGLE:
        return SpeculationConfig(kind, length)
    files = {}
    for key, default in EAGLE_FILE_FIELDS.items():
        name = config.get(key, default)
        path = bundle_path(config_path.parent, name, f"{config_path}: field {key!r}", links=links)
        if not path.is_file():
            raise BundleError(f"{config_path}: field {key!r} = {name!r} but {path} does not exist")
        files[key] = path
    tree = {key: _positive(config_path, config, key, v, EAGLE_TREE_MAX) for key, v in EAGLE_TREE_DEFAULTS.items()}
    return SpeculationConfig(kind, length, topk=tree["eagle_topk"], depth=tree["eagle_depth"], **files)


@dataclass
class DraftTree:
    """A draft's token tree, in creation order (the engine's node ids): every node ever proposed, pruned or not."""

    tokens: list[int] = field(default_factory=list)
    """Target token ids."""
    parents: list[int] = field(default_factory=list)
    """Index of each node's parent node; -1 under the root (the sampled token)."""
    depths: list[int] = field(default_factory=list)
    """0 for the root's children."""
    scores: list[float] = field(default_factory=list)
    """Cumulative draft log-probability of the path to the node."""

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.scores.append(float(score) + (0.0 if parent < 0 else self.scores[parent]))
        return len(self.tokens) - 1

    def best(self, n: int) -> list[int]:
        """The ``n`` best nodes by cumulative score, in creation order (the engine's ``finalize``); ties go to the
        older node, so a kept node's parent is kept (a child never scores above its parent)."""
        ranked = sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], i))
        return sorted(ranked[:n])

    def branching(self, n: int) -> list[int]:
        """:meth:`best`'s nodes, unless they form a chain (a draft that sure of itself): then its deepest node gives
        way to the best node that branches off the rest (a child of the root or of any kept node but the last), so
        a tree mask that is not causal gets exercised. In creation order."""
        kept = self.best(n)
        if n < 2 or len(kept) < n or len(self.paths(kept)) > 1:
            return kept
        rest = kept[:-1]
        ranked = sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], i))
        forks = rest[:-1]  # a child of the last kept node would make the chain again
        fork = next((i for i in ranked if i not in kept and (self.parents[i] < 0 or self.parents[i] in forks)), None)
        return kept if fork is None else sorted([*rest, fork])

    def paths(self, kept: Sequence[int]) -> list[list[int]]:
        """Root-to-leaf paths through the ``kept`` nodes, as node indices, leaves in creation order."""
        keep = set(kept)
        inner = {self.parents[i] for i in keep}
        out = []
        for leaf in (i for i in kept if i not in inner):
            path, at = [], leaf
            while at >= 0 and at in keep:
                path.append(at)
                at = self.parents[at]
            out.append(path[::-1])
        return out

    def chain(self, n: int) -> list[int]:
        """The tokens of the longest path among the ``n`` best nodes (ties: the better-scored leaf): what a chain
        verifier confirms. At ``eagle_topk`` 1 it is the whole kept chain."""
        paths = self.paths(self.best(n))
        if not paths:
            return []
        best = max(paths, key=lambda p: (len(p), self.scores[p[-1]]))
        return [self.tokens[i] for i in best]

    def inputs(
        self, sample_token: int, n: int, nodes: Sequence[int] | None = None
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """The engine's verifying forward for the ``n`` best nodes (or ``nodes``, closed under parents): tokens (the
        sampled token first), the tree mask (``[1, 1, n+1, n+1]`` float, 0 where a row sees a column, the lowest
        float elsewhere: each node sees the sampled token, its ancestors and itself) and positions relative to the
        sampled token's (its depth + 1)."""
        kept = sorted(nodes) if nodes is not None else self.best(n)
        index = {node: row + 1 for row, node in enumerate(kept)}
        size = len(kept) + 1
        sees = np.eye(size, dtype=bool)
        sees[:, 0] = True
        for node, row in index.items():
            at = self.parents[node]
            while at >= 0:
                sees[row, index[at]] = True
                at = self.parents[at]
        mask = np.where(sees, 0.0, LOWEST).astype(np.float32).reshape(1, 1, size, size)
        positions = np.array([0] + [self.depths[i] + 1 for i in kept], dtype=np.int32)
        return [int(sample_token)] + [self.tokens[i] for i in kept], mask, positions


class Drafter(Protocol):
    """Proposes the target's next tokens for the sequence so far (the last token is the one just picked, not yet fed
    to the target); ``hidden``: the target's ``hidden_states`` rows of every position but the last (None when the
    target gives none). ``start`` begins a generation (a drafter may keep state across its rounds);
    ``needs_hidden``: it proposes only once those rows are at hand."""

    draft_length: int
    needs_hidden: bool

    def start(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(self, tokens: Sequence[int], hidden: np.ndarray | None) -> list[int]: ...


class EagleDrafter:
    """An Eagle3 draft (``eagle.mnn``, ``eagle_fc.mnn``, ``eagle_d2t.mnn`` named by the model's config) in PyPI MNN
    on the CPU, with the target's token embeddings."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        runtime: CpuRuntime | None = None,
        *,
        config_name: str = MODEL_CONFIG,
        embed: Embeddings | None = None,
        links: bool = False,
    ) -> None:
        self.model_dir = Path(model_dir)
        config_path = self.model_dir / config_name
        spec = speculation_config(config_path, links=links)
        if spec is None or spec.kind != EAGLE:
            raise BundleError(f"{config_path}: field 'speculative_type' is not 'eagle'; no Eagle draft to load")
        assert spec.eagle_model is not None and spec.eagle_fc is not None and spec.eagle_d2t is not None
        self.config = spec
        self.embed = embed or Embeddings(self.model_dir, links=links)
        rt = (runtime or CpuRuntime()).create()
        self._fc = load_module(spec.eagle_fc, rt, *map(list, EAGLE_GRAPH_IO["eagle_fc"]))
        self._layer = load_module(spec.eagle_model, rt, *map(list, EAGLE_GRAPH_IO["eagle_model"]))
        try:  # read from the flatbuffer: MNN's loader crashes on an empty or truncated file
            self.d2t = read_draft_map(spec.eagle_d2t)
        except MNNFormatError as exc:
            raise BundleError(str(exc)) from None
        self.forwards = 0
        """Draft forwards run so far."""

    needs_hidden = True

    @property
    def draft_length(self) -> int:
        return self.config.draft_length

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Nothing to keep between rounds: each draft is recomputed from the sequence."""

    def _fc_rows(self, hidden: np.ndarray) -> np.ndarray:
        rows = np.asarray(hidden, dtype=np.float32).reshape(1, -1, hidden.shape[-1])
        (out,) = forward_vars(self._fc, [to_var(rows)])
        return to_numpy(out).reshape(rows.shape[1], -1)

    def _layer_rows(
        self, embeds: np.ndarray, hidden: np.ndarray, sees: np.ndarray, positions: np.ndarray, first: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One draft forward over all rows; log-probabilities and output rows of rows ``first..``."""
        rows = len(embeds)
        mask = np.where(sees, 0.0, LOWEST).astype(np.float32).reshape(1, 1, rows, rows)
        feed = [
            to_var(embeds.reshape(rows, 1, -1).astype(np.float32)),
            to_var(hidden.reshape(1, rows, -1).astype(np.float32)),
            to_var(mask),
            to_var(positions.astype(np.int32).reshape(1, rows)),
            to_var(np.array([first], dtype=np.int32)),
        ]
        logits, out = forward_vars(self._layer, feed)
        self.forwards += 1
        logits, out = to_numpy(logits), to_numpy(out)
        width = out.shape[-1]
        return logits.reshape(-1, logits.shape[-1])[-(rows - first) :], out.reshape(-1, width)[-(rows - first) :]

    def _top(self, row: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ``k`` best draft ids of a log-probability row, as (target id, log-probability), best first."""
        order = np.argsort(-row, kind="stable")[:k]
        return [(int(d + self.d2t[d]), float(row[d])) for d in order]

    def tree(
        self, tokens: Sequence[int], hidden: np.ndarray, topk: int | None = None, depth: int | None = None
    ) -> DraftTree:
        """The engine's token tree after ``tokens`` (``topk``/``depth``: the config's unless given): the root's
        ``topk`` best children, then per level the ``topk`` best of the active nodes' ``topk`` children each, by
        cumulative score. ``hidden``: the target's rows of ``tokens[:-1]``."""
        topk = topk or self.config.topk
        depth = depth or self.config.depth
        tokens = [int(t) for t in tokens]
        seq = len(tokens) - 1
        if seq < 1 or hidden is None or len(hidden) < seq:
            raise BundleError(f"the draft needs the target's hidden rows of {max(seq, 1)} positions")
        # the sequence's rows: hidden of position p with the embedding of token p + 1, at position p
        embeds = [self.embed(tokens[1:])]
        rows_hidden = [self._fc_rows(np.asarray(hidden)[:seq])]
        positions = [np.arange(seq)]
        sees = np.tril(np.ones((seq, seq), dtype=bool))
        logp, out = self._layer_rows(embeds[0], rows_hidden[0], sees, positions[0], seq - 1)
        tree = DraftTree()
        actives = [tree.add(t, -1, s) for t, s in self._top(logp[0], topk)]
        parent_out = {a: out[0] for a in actives}
        fed: dict[int, int] = {}  # node -> its row in the draft forward
        for level in range(depth - 1):
            first = len(sees)
            fed |= {a: first + j for j, a in enumerate(actives)}
            grown = np.zeros((first + len(actives),) * 2, dtype=bool)
            grown[:first, :first] = sees
            for j, a in enumerate(actives):
                grown[first + j, :seq] = True
                at = a
                while at >= 0:
                    grown[first + j, fed[at]] = True
                    at = tree.parents[at]
            sees = grown
            embeds.append(self.embed([tree.tokens[a] for a in actives]))
            rows_hidden.append(np.stack([parent_out[a] for a in actives]))
            positions.append(np.full(len(actives), seq + level))
            logp, out = self._layer_rows(
                np.concatenate(embeds), np.concatenate(rows_hidden), sees, np.concatenate(positions), first
            )
            candidates = [
                (tree.scores[a] + s, n, a, t, s)
                for j, a in enumerate(actives)
                for n, (t, s) in enumerate(self._top(logp[j], topk), start=j * topk)
            ]
            children = {n: tree.add(t, a, s) for _, n, a, t, s in candidates}
            outs = {a: out[j] for j, a in enumerate(actives)}
            chosen = sorted(candidates, key=lambda c: (-c[0], c[1]))[:topk]
            actives = [children[n] for _, n, *_ in chosen]
            parent_out = {children[n]: outs[a] for _, n, a, *_ in chosen}
        return tree

    def propose(self, tokens: Sequence[int], hidden: np.ndarray | None) -> list[int]:
        if hidden is None:
            raise BundleError("the Eagle draft needs the target's 'hidden_states' output; the forward gives none")
        return self.tree(tokens, hidden).chain(self.draft_length)


@dataclass
class Round:
    """One target round: the draft proposed, how much of it held, what it gave."""

    draft: list[int]
    accepted: int
    """Draft tokens confirmed."""
    tokens: int
    """Tokens the round added (``accepted`` and the target's own next one, unless the loop ended)."""
    forwards: int
    """Target forwards it ran (one per prefill length its tokens reach)."""
    cut: bool = False
    """The draft was cut to the tokens left (the last round): not a full round's measure."""


@dataclass
class SpeculativeResult:
    result: GenerationResult
    """The tokens, each step's row and margin, as :func:`recompute_generate` gives them."""
    rounds: list[Round]
    draft_length: int

    @property
    def forwards(self) -> int:
        return sum(r.forwards for r in self.rounds)

    @property
    def mean_accepted(self) -> float | None:
        """Tokens per target forward over the decoding rounds (all but the first, the prompt's: the engine's
        prefill), as MNN's engine counts its decode; a round that found no draft (lookahead without a match) is a
        one-token forward and counts. A last round whose draft was cut to the tokens left counts only when no
        other round decoded (the engine does not cut it: it may give tokens past the limit). None when no round
        decoded."""
        decoding = self.rounds[1:]
        counted = [r for r in decoding if not r.cut] or decoding
        forwards = sum(r.forwards for r in counted)
        return sum(r.tokens for r in counted) / forwards if forwards else None

    def cut(self, count: int) -> SpeculativeResult:
        """The loop's first ``count`` tokens and the rounds that gave them (the last one cut where they end, and
        marked so: `mean_accepted` leaves it out as it does a draft cut to the tokens left)."""
        r = self.result
        result = GenerationResult(r.prompt, r.tokens[:count], "cut", r.chunk, r.step_seconds[:count],
                                  r.top2_margins[:count], r.rows[:count])  # fmt: skip
        rounds: list[Round] = []
        given = 0
        for one in self.rounds:
            if given >= count:
                break
            take = min(one.tokens, count - given)
            rounds.append(one if take == one.tokens else Round(one.draft, min(one.accepted, take), take, one.forwards,
                                                               cut=True))  # fmt: skip
            given += take
        return SpeculativeResult(result, rounds, self.draft_length)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.result.tokens,
            "forwards": self.forwards,
            "mean_accepted": self.mean_accepted,
            "draft_length": self.draft_length,
            "rounds": [vars(r) for r in self.rounds],
        }


HIDDEN = "hidden_states"


def speculative_generate(
    forward: ForwardFn,
    embed: Callable[[Sequence[int]], np.ndarray],
    drafter: Drafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    chunk: int | Sequence[int],
    stop_ids: Sequence[int] = (),
) -> SpeculativeResult:
    """Greedy tokens of ``forward``'s model, ``drafter.draft_length`` guessed per round and confirmed by
    :func:`follow_draft` (see the module docstring): the tokens are :func:`recompute_generate`'s."""
    prompt, limits, largest = _loop_setup(prompt_ids, chunk)
    chunk_arg = limits or largest
    result = GenerationResult(prompt, [], "max_new_tokens", largest)
    rounds: list[Round] = []
    hidden: list[np.ndarray] = []  # the target's rows of the sequence's positions so far
    has_hidden = True
    seen: dict[int, Mapping[str, np.ndarray]] = {}  # this round's forwards' outputs, by length

    def confirm(feed: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        outputs = forward(feed)
        seen[int(np.shape(feed["input_ids"])[0])] = outputs
        return outputs

    drafter.start(prompt)
    while len(result.tokens) < max_new_tokens:
        seq = result.sequence
        if len(seq) >= largest:
            result.stop_reason = "chunk_full"
            break
        room = min(max_new_tokens - len(result.tokens), largest - len(seq))
        # the prompt's round only prefills (the engine's too): a draft follows a picked token
        ready = bool(result.tokens) and (not drafter.needs_hidden or (len(hidden) == len(seq) - 1 and has_hidden))
        proposed = [int(t) for t in drafter.propose(seq, np.stack(hidden))] if ready else []
        draft = proposed[: max(room - 1, 0)]
        seen.clear()
        outcome = follow_draft(confirm, embed, seq, draft, len(draft) + 1, chunk_arg, stop_ids, follow=False)
        got = outcome.result
        accepted = next((i for i, (a, b) in enumerate(zip(draft, got.tokens, strict=False)) if a != b), None)
        rounds.append(Round(draft, min(len(draft), len(got.tokens)) if accepted is None else accepted,
                            len(got.tokens), outcome.forwards, len(draft) < len(proposed)))  # fmt: skip
        result.tokens += got.tokens
        result.top2_margins += got.top2_margins
        result.step_seconds += got.step_seconds
        result.rows += got.rows
        # the hidden rows of the positions now behind the last token, from the smallest forward that fed each
        fed = _DraftPlan.of(seq, draft, len(draft) + 1, chunk_arg).longest
        for p in range(len(hidden), len(result.sequence) - 1):
            size = min(s for s in seen if fed[s] > p)
            if HIDDEN not in seen[size]:
                has_hidden = False
                break
            rows = np.asarray(seen[size][HIDDEN])
            hidden.append(rows.reshape(-1, rows.shape[-1])[p].copy())
        if got.stop_reason in ("stop_token", "chunk_full"):
            result.stop_reason = got.stop_reason
            break
    log.info("speculative: %d tokens in %d forwards (%s)", len(result.tokens), sum(r.forwards for r in rounds),
             result.stop_reason)  # fmt: skip
    return SpeculativeResult(result, rounds, drafter.draft_length)


@dataclass
class OracleDrafter:
    """Proposes a known token sequence's next tokens (the target's own greedy tokens make a draft that is always
    right; shifted ones, one that is always wrong): a measuring stick for the loop's acceptance count."""

    sequence: list[int]
    draft_length: int
    shift: int = 0
    """Added to each proposed token (mod ``vocab``): 0 proposes the sequence itself."""
    vocab: int = 1
    needs_hidden = False

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Nothing to reset: the sequence is known."""

    def propose(self, tokens: Sequence[int], hidden: np.ndarray | None) -> list[int]:
        n = len(tokens)
        if list(tokens) != self.sequence[:n]:
            return []
        return [(t + self.shift) % self.vocab if self.shift else t for t in self.sequence[n : n + self.draft_length]]


@dataclass
class EngineRun:
    """Greedy tokens from MNN's own LLM engine (``MNN.llm``, with its KV cache), with or without speculation."""

    prompt_ids: list[int]
    tokens: list[int]
    """The generated tokens (the engine may give a round's accepted tokens past ``max_new_tokens``)."""
    forwards: int | None
    """Target forwards after the prefill (speculation only: the count MNN's Eagle decoding appends after the
    tokens when it stops, ``speculative_decoding/eagle.cpp``; lookahead: ``len(rounds)``)."""
    rounds: list[int] | None = None
    """lookahead: the tokens each target forward after the prefill added to the output (its accepted drafts and
    the token it had picked before), from where the engine stops (:func:`engine_generate`)."""

    @property
    def mean_accepted(self) -> float | None:
        """Tokens per target forward after the prefill's token."""
        if self.rounds:
            return sum(self.rounds) / len(self.rounds)
        return (len(self.tokens) - 1) / self.forwards if self.forwards else None


ENGINE_FULL_PRECISION = {"precision": "high", "memory": "normal"}
"""Float activations and weights decoded to fp32: with ``memory: low`` (llmexport's default) the engine quantizes
activations on the fly, and a forward of several rows (speculation's) and one of one row (plain decoding's) may
then part at a near-tie."""


def engine_threads(config: Mapping[str, Any]) -> dict[str, int]:
    """``thread_num`` at the CPUs this process may use when the config's (MNN's default: 4) is more, else nothing:
    MNN's threads spin waiting for each other, so one past the cores only waits (`mnnbuild.cpu.CpuRuntime.threads`);
    the values are the same with any count."""
    asked, cpus = config.get("thread_num", 4), usable_cpus()
    return {"thread_num": cpus} if isinstance(asked, int) and not isinstance(asked, bool) and asked > cpus else {}


def engine_generate(
    config_path: str | os.PathLike[str],
    prompt: str,
    max_new_tokens: int,
    *,
    speculative: bool,
    links: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> EngineRun:
    """``prompt``'s greedy continuation by PyPI MNN's engine with the model's config and full precision
    (:data:`ENGINE_FULL_PRECISION`), its speculation on (the config's ``speculative_type``, or ``settings``') or
    off; ``settings``: config entries set on top (e.g. lookahead's, on a model whose config has none).

    lookahead reports no count of its own; its forwards are read from where it stops: it checks the limit only
    between rounds, so a run capped at ``k`` tokens ends at the first round end at or past ``k``. Runs capped at
    1, then one past each end found, give every round's tokens up to ``max_new_tokens`` (one engine load, a run
    per round)."""
    config_path = Path(config_path)
    config = {**read_config(config_path, links=links), **(settings or {})}
    check_engine_files(config_path, config, links=links)  # the engine opens what the config names itself
    kind = config.get("speculative_type", "") if speculative else ""
    if speculative and not kind:
        raise BundleError(f"{config_path}: field 'speculative_type' is not set; the engine cannot speculate")
    import_mnn()
    ends: list[int] = []
    with native_output(f"MNN's LLM engine ({config_path})"):
        import MNN.llm  # never MNN.tools

        engine = MNN.llm.create(str(config_path))
        engine.set_config({**ENGINE_FULL_PRECISION, **(settings or {}), "speculative_type": kind, "sampler_type":
                           "greedy", "max_new_tokens": max_new_tokens, "use_template": False,
                           **engine_threads(config)})  # fmt: skip
        engine.load()
        if engine.context.status.name in ("NOT_LOADED", "INTERNAL_ERROR"):
            raise BundleError(f"{config_path}: MNN's LLM engine cannot load this model")
        if kind == LOOKAHEAD:
            while not ends or ends[-1] < max_new_tokens:
                engine.set_config({"max_new_tokens": ends[-1] + 1 if ends else 1})
                engine.response(prompt)
                got = len(engine.context.output_tokens)
                if ends and got <= ends[-1]:  # a stop token ended it inside the round
                    break
                ends.append(got)
        else:
            engine.response(prompt)
        out, history = list(engine.context.output_tokens), list(engine.context.history_tokens)
        del engine
    return_freed_memory()
    forwards, rounds = None, None
    if kind == EAGLE and len(out) > 1 and out[:-1] == history[len(history) - len(out) + 1 :]:
        forwards = out.pop()  # not a token: Eagle decoding's forward count (history_tokens has none)
    if kind == LOOKAHEAD:
        rounds = [b - a for a, b in zip([0, *ends], ends, strict=False)]
        forwards = len(rounds)
    prompt_ids = history[: len(history) - len(out)]
    return EngineRun(prompt_ids, out, forwards, rounds)
