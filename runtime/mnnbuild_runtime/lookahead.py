"""Lookahead drafts: the n-gram drafter MNN's engine runs for ``speculative_type = "lookahead"``, written for this
runtime from the engine's rules (``speculative_decoding/lookahead.cpp`` and ``ngram.hpp``, MNN 4d40bdbd).

No draft model: the drafts come from a cache of n-grams (keys of 1 to ``ngram_match_maxlen`` tokens, each mapped to
the tokens that followed it) built from the prompt, then from the model dir's lookup file when there is one, and, with
``ngram_update``, from the decoded tokens. Each round the sequence's last tokens (the ones picked so far plus the
drafts found) are looked up key by key, ``draft_predict_length`` times; once a draft token is found the rest of the
draft is padded with token 0 (the engine verifies one row or ``draft_predict_length + 1``, nothing in between).

The engine's rules, kept here as they are (they decide which tokens are drafted, so the acceptance it reports):

- ``draft_selection_rule = "freqxlen"``: every key length from the longest down is looked up; a candidate scores
  (times it followed the key) x (key length) and replaces the best so far only when it scores strictly more, so a tie
  goes to the longer key and, within one key, to the token met first in the engine's ``std::unordered_map`` order
  (:class:`StdCounts` reproduces libstdc++'s, which MNN's Linux wheels run on). ``"fcfs"``: the longest key that
  matches gives the first token ever seen after it.
- ``draft_match_strictness`` ("low" / "medium" / "high") applies to the first draft token only, and only under
  "freqxlen": the chosen token's share of its key's counts must reach a threshold per key length (medium 60 50 50 40
  ..., high 90 80 70 60 50 ...), else no draft. After a punctuation token ("," "." ":" ";" and their CJK forms) the
  first draft is judged as "high" whatever the setting.
- ``ngram_update``: after each round the engine adds the n-grams ending at the last ``i`` positions of the history it
  held *before* that round's tokens were appended (``i``: the tokens the round accepted), so it recounts some
  transitions and skips others; reproduced as is.

:class:`LookaheadDrafter` keeps the cache across the rounds of one generation (:meth:`LookaheadDrafter.start` begins
one); :func:`~mnnbuild_runtime.speculative.speculative_generate` confirms its drafts like any other drafter's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn.llm import (
    DEFAULT_DRAFT_LENGTH,
    DRAFT_LENGTH_FIELD,
    LOOKAHEAD,
    LOOKUP_FILE_FIELD,
    MODEL_CONFIG,
    SPECULATIVE_TYPE,
    draft_length,
    lookahead_settings,
    read_lookup_file,
)
from mnnbuild_runtime.bundle import bundle_path, read_config, read_json_object
from mnnbuild_runtime.errors import BundleError

log = logging.getLogger(__name__)

SHARE_MEDIUM = (60, 50, 50, 40, 40, 40, 40, 40)
SHARE_HIGH = (90, 80, 70, 60, 50, 50, 50, 50)
"""Per key length (1..8): the percent of its key's counts the first draft token must hold (``ngram.hpp``)."""
CONFUSING = frozenset({",", ".", ":", "、", ";", "，", "。", "：", "；"})
"""Tokens after which the engine judges the first draft as ``draft_match_strictness = "high"``."""
PAD = 0
"""What the engine pads a found draft with, up to ``draft_predict_length`` tokens."""

Strictness = Literal["low", "medium", "high"]
Rule = Literal["freqxlen", "fcfs"]

# libstdc++'s unordered_map: 13 buckets at the first insert, then the next size when the elements would outnumber
# the buckets (its prime rehash policy; measured with the box's g++ and libstdc++.so.6)
_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061, 712697,
            1447153, 2938679)  # fmt: skip


class StdCounts:
    """Token -> count, iterated in the order libstdc++'s ``std::unordered_map<int, int>`` iterates (the engine's
    ``ngram_value``): one singly linked list where a new token goes first in its bucket's run, or first of all when
    its bucket is empty; growing the table re-links the nodes the same way, in list order. The hash of an int is the
    int, its bucket the int modulo the bucket count."""

    def __init__(self) -> None:
        self.order: list[int] = []
        self.counts: dict[int, int] = {}
        self._size = 0  # the bucket count (0: nothing allocated yet)

    @staticmethod
    def _link(order: list[int], token: int, buckets: int) -> None:
        bucket = token % buckets
        at = next((i for i, t in enumerate(order) if t % buckets == bucket), 0)
        order.insert(at, token)

    def add(self, token: int) -> None:
        if token in self.counts:
            self.counts[token] += 1
            return
        if len(self.counts) + 1 > self._size:
            grown = next((b for b in _BUCKETS if b > self._size), None)
            if grown is None:
                raise BundleError(f"an n-gram followed by more than {_BUCKETS[-1]} distinct tokens")
            relinked: list[int] = []
            for t in self.order:
                self._link(relinked, t, grown)
            self.order, self._size = relinked, grown
        self._link(self.order, token, self._size)
        self.counts[token] = 1

    def items(self) -> list[tuple[int, int]]:
        return [(t, self.counts[t]) for t in self.order]


@dataclass(frozen=True)
class LookaheadSettings:
    """A model's lookahead fields (``llmconfig.hpp``'s names and defaults)."""

    draft_length: int = DEFAULT_DRAFT_LENGTH
    strictness: Strictness = "low"
    rule: Rule = "freqxlen"
    max_key: int = 4
    update: bool = False
    lookup_file: Path | None = None
    """The prior text the engine reads when the file exists (``lookup_file``, default ``lookup_file.txt``)."""

    @property
    def verify_length(self) -> int:
        return self.draft_length + 1

    def engine_config(self) -> dict[str, Any]:
        """The fields that make MNN's engine run these settings (beside ``speculative_type``)."""
        return {
            DRAFT_LENGTH_FIELD: self.draft_length,
            "draft_match_strictness": self.strictness,
            "draft_selection_rule": self.rule,
            "ngram_match_maxlen": self.max_key,
            "ngram_update": self.update,
        }

    @classmethod
    def of(cls, config_path: str | os.PathLike[str], *, links: bool = False) -> LookaheadSettings:
        """The settings of a config whose ``speculative_type`` is "lookahead", merged with the ``llm_config.json`` it
        names as MNN's engine merges it (:func:`~mnnbuild.mnn.llm.lookahead_settings`, the one reader of them); a
        value the engine would read wrongly, or ignore for its default, is one line naming the file and field. The
        lookup file, when there is one, must be a file of the model dir and readable as the engine takes it
        (:func:`~mnnbuild.mnn.llm.read_lookup_file`)."""
        config_path = Path(config_path)
        config = read_config(config_path, links=links)
        if config.get(SPECULATIVE_TYPE) != LOOKAHEAD:
            raise BundleError(f"{config_path}: field {SPECULATIVE_TYPE!r} is not {LOOKAHEAD!r}; no lookahead to run")
        sources: list[tuple[object, dict[str, Any]]] = [(config_path, config)]
        name = config.get("llm_config", "llm_config.json")
        llm_config = bundle_path(config_path.parent, name, f"{config_path}: field 'llm_config'", links=links)
        if llm_config.is_file():
            sources.append((llm_config, read_json_object(llm_config, "file missing", links=links)))
        try:
            length = draft_length(config, config_path)
            got = lookahead_settings(sources)
        except ValueError as exc:
            raise BundleError(str(exc)) from None
        where = next((str(w) for w, f in reversed(sources) if LOOKUP_FILE_FIELD in f), str(config_path))
        lookup = bundle_path(config_path.parent, got[LOOKUP_FILE_FIELD], f"{where}: field {LOOKUP_FILE_FIELD!r}",
                             links=links)  # fmt: skip
        present = read_lookup(lookup, links, f"{Path(where).name} field {LOOKUP_FILE_FIELD!r}") is not None
        return cls(
            draft_length=length,
            strictness=got["draft_match_strictness"],
            rule=got["draft_selection_rule"],
            max_key=got["ngram_match_maxlen"],
            update=got["ngram_update"],
            lookup_file=lookup if present else None,
        )


def read_lookup(path: Path, links: bool = False, field: str = LOOKUP_FILE_FIELD) -> str | None:
    """The lookup file's text (None: none), read as MNN's engine takes it (``links``: see
    :func:`~mnnbuild_runtime.bundle.bundle_path`); a file it cannot use is one BundleError naming it and ``field``."""
    try:
        return read_lookup_file(path, follow=links)
    except MNNFormatError as exc:
        raise BundleError(f"{exc} ({field})") from None


class NgramCache:
    """The engine's n-gram cache under one selection rule: key (1 to ``max_key`` tokens) -> what followed it."""

    def __init__(self, rule: Rule, max_key: int) -> None:
        self.rule, self.max_key = rule, max_key
        self.counts: dict[tuple[int, ...], StdCounts] = {}
        self.firsts: dict[tuple[int, ...], int] = {}

    def update(self, tokens: Sequence[int], new: int) -> None:
        """Add the n-grams ending at the last ``new`` positions of ``tokens`` (the engine's ``ngram_cache_update``:
        key length by key length, positions in order)."""
        n = len(tokens)
        for size in range(1, self.max_key + 1):
            for i in range(max(n - new, size), n):
                key = tuple(tokens[i - size : i])
                if self.rule == "fcfs":
                    self.firsts.setdefault(key, int(tokens[i]))
                else:
                    self.counts.setdefault(key, StdCounts()).add(int(tokens[i]))

    def next_token(self, seq: Sequence[int], strictness: Strictness) -> int | None:
        """The draft token after ``seq`` (history and drafts so far), or None (the engine's ``ngram_cache_search``
        for one token)."""
        best, best_score = None, 0
        for size in range(self.max_key, 0, -1):
            if size > len(seq):  # the engine's key then starts with -1s: no stored key matches it
                continue
            key = tuple(seq[len(seq) - size :])
            if self.rule == "fcfs":
                if key in self.firsts:
                    return self.firsts[key]
                continue
            found = self.counts.get(key)
            if found is None:
                continue
            total = top = 0
            for token, count in found.items():
                total += count
                if count * size > best_score:
                    best, best_score, top = token, count * size, count
            if top and strictness != "low":
                need = (SHARE_MEDIUM if strictness == "medium" else SHARE_HIGH)[size - 1]
                if 100.0 * top / total < need:
                    best = None  # its score still stands: a shorter key must beat it
        return best


class LookaheadDrafter:
    """MNN's lookahead n-gram drafter for a model dir or bundle whose config says ``speculative_type =
    "lookahead"``. Its tokenizer decodes the picked token (the punctuation rule) and encodes the lookup file."""

    needs_hidden = False

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        config_name: str = MODEL_CONFIG,
        decode: Callable[[int], str] | None = None,
        encode: Callable[[str], list[int]] | None = None,
        settings: LookaheadSettings | None = None,
        links: bool = False,
    ) -> None:
        """``decode``/``encode``: the model's tokenizer (default: MNN's, from the config); ``settings``: instead of
        the config's (to run other lookahead settings on the same model)."""
        config_path = Path(model_dir) / config_name
        self.settings = settings or LookaheadSettings.of(config_path, links=links)
        if decode is None or encode is None:
            from mnnbuild_runtime.tokenizer import Tokenizer

            tokenizer = Tokenizer(config_path, links=links)
            decode = decode or (lambda t: tokenizer.decode([t]))
            encode = encode or tokenizer.encode
        self._decode, self._encode, self._links = decode, encode, links
        self._prior: list[int] | None = None
        self.cache = NgramCache(self.settings.rule, self.settings.max_key)
        self._last: list[int] | None = None
        self.rounds = 0
        """Rounds proposed for since :meth:`start`."""

    @property
    def draft_length(self) -> int:
        return self.settings.draft_length

    def _prior_ids(self) -> list[int]:
        if self._prior is None:
            path = self.settings.lookup_file
            text = read_lookup(path, self._links) if path is not None else None  # checked again as it is read
            self._prior = self._encode(text) if text is not None else []
        return self._prior

    def start(self, prompt_ids: Sequence[int]) -> None:
        """A new generation after ``prompt_ids``: the cache holds the prompt's n-grams, then the lookup file's."""
        self.cache = NgramCache(self.settings.rule, self.settings.max_key)
        prompt = [int(t) for t in prompt_ids]
        self.cache.update(prompt, len(prompt))
        prior = self._prior_ids()
        self.cache.update(prior, len(prior))
        self._last, self.rounds = None, 0

    def propose(self, tokens: Sequence[int], hidden: np.ndarray | None = None) -> list[int]:
        """The draft after ``tokens`` (the last one picked, not yet fed): up to ``draft_length`` tokens, padded with
        token 0 to that length once one is found; [] when none is."""
        seq = [int(t) for t in tokens]
        if self._last is not None and self.settings.update:
            # the engine's update after the previous round: the history it held then, the tokens that round took
            self.cache.update(self._last[:-1], len(seq) - len(self._last))
        self._last = seq
        self.rounds += 1
        strictness: Strictness = "high" if self._decode(seq[-1]) in CONFUSING else self.settings.strictness
        draft: list[int] = []
        while len(draft) < self.draft_length:
            token = self.cache.next_token(seq + draft, strictness if not draft else "low")
            if token is None:
                break
            draft.append(token)
        return draft + [PAD] * (self.draft_length - len(draft)) if draft else []
