"""MNN's LLM conventions, as its engine (``transformers/llm/engine``) has them: the model directory's file names,
a language model graph's input names, and the causal attention mask it is fed.

The format layer both the build and the runtime import: what MNN names and expects is declared once here.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnnbuild.base.errors import MNNFormatError

if TYPE_CHECKING:
    import numpy as np

MODEL_CONFIG = "config.json"
"""The model directory's engine config (``llm_model``, ``llm_weight``, ``tokenizer_file``...)."""
DEFAULT_MODEL = "llm.mnn"
DEFAULT_WEIGHT = "llm.mnn.weight"
"""MNN's default graph and weight file when a config names none (llmconfig.hpp ``llm_model``, ``llm_weight``)."""
DEFAULT_TOKENIZER = "tokenizer.txt"
"""MNN's default ``tokenizer_file``."""
DEFAULT_EMBEDDINGS = "embeddings_bf16.bin"
"""MNN's default ``embedding_file``: an untied model's token embeddings, bf16."""

LLM_INPUTS = ("input_ids", "attention_mask", "position_ids", "logits_index")
"""A language model graph's inputs as MNN's engine feeds them, in that order (``input_ids`` holds the embeddings)."""
DEEPSTACK_INPUT = "deepstack_embeds"
"""Qwen3-VL's language model input: visual features added to the first layers' hidden states."""


def causal_mask(seq: int) -> np.ndarray:
    """``attention_mask`` for ``seq`` rows: ``[1,1,seq,seq]`` float, 0 on and below the diagonal, the lowest float
    above it."""
    import numpy as np

    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, dtype=np.float32), k=1)
    return mask.reshape(1, 1, seq, seq)


MIXED_ATTENTION = "mix"
"""``llm_config.json``'s ``attention_type`` of a model whose layers mix full and sliding-window attention (llmexport
writes it for Gemma 3, gpt-oss, Qwen3.5): MNN's engine then feeds a two-part mask, full and sliding. Every other
kind (``"full"``; ``"sliding"``, all layers sliding) gets the one causal mask (``llm.cpp gen_attention_mask``)."""


def attention_window(config: Mapping[str, Any]) -> int | None:
    """The sliding window of a model whose mask MNN's engine builds in two parts (``attention_type`` ``"mix"``),
    from its (merged) LLM config; None for a model fed one causal mask. A mixed model without a positive
    ``sliding_window`` is refused (ValueError naming the field): the engine would hide every key of its sliding
    layers."""
    if config.get("attention_type", "full") != MIXED_ATTENTION:
        return None
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise ValueError(
            f"field 'sliding_window' must be a positive integer when 'attention_type' is {MIXED_ATTENTION!r} "
            f"(the engine feeds its sliding layers a mask of that window), got {window!r}"
        )
    return window


def windowed_mask(mask: np.ndarray, window: int | None) -> np.ndarray:
    """A ``[1,1,seq,kv]`` float mask as MNN's engine feeds a model of sliding ``window`` (None: unchanged): stacked
    ``[2,1,1,seq,kv]``, the mask itself for the full-attention layers and, for the sliding ones, the mask with the
    keys ``window`` or more positions behind each row's query hidden too (the query of row ``i`` is position
    ``i + kv - seq``). A mask already in two parts is returned as it is."""
    import numpy as np

    if window is None or mask.ndim == 5:
        return mask
    rows, keys = mask.shape[-2:]
    query = np.arange(rows)[:, None] + (keys - rows)
    behind = np.arange(keys)[None, :] <= query - window
    full = np.asarray(mask, dtype=np.float32).reshape(1, 1, rows, keys)
    sliding = np.where(behind, np.finfo(np.float32).min, full).astype(np.float32)
    return np.stack([full, sliding])


def engine_mask(seq: int, window: int | None = None) -> np.ndarray:
    """``attention_mask`` as MNN's engine builds it for a block of ``seq`` rows with nothing cached before it: the
    :func:`causal_mask`, in two parts for a model with sliding ``window`` (:func:`windowed_mask`)."""
    return windowed_mask(causal_mask(seq), window)


# -- speculative decoding (llmconfig.hpp, speculative_decoding/ of MNN 4d40bdbd) ---------------------------------
SPECULATIVE_TYPE = "speculative_type"
"""The config field that turns speculation on (empty: off)."""
EAGLE = "eagle"
LOOKAHEAD = "lookahead"
SPECULATIVE_TYPES = (EAGLE, LOOKAHEAD)
"""The kinds a bundle can be built for: Eagle3 (a draft model) and lookahead (n-gram drafts, any model)."""
DRAFT_LENGTH_FIELD = "draft_predict_length"
DEFAULT_DRAFT_LENGTH = 3
"""``draft_predict_length``'s engine default: a verify forward holds it + 1 tokens."""
EAGLE_FILE_FIELDS = {"eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn", "eagle_d2t": "eagle_d2t.mnn"}
"""An Eagle model's draft files: config field -> the engine's default name."""
EAGLE_TREE_DEFAULTS = {"eagle_depth": 3, "eagle_topk": 1}
EAGLE_TREE_MAX = 64
"""The largest ``eagle_depth`` and ``eagle_topk`` taken: each level is one draft forward over ``topk``² candidates,
and the engine verifies at most ``draft_predict_length`` (<= 64) of the tree's nodes, so a deeper or wider tree only
costs; ``eagle_depth`` 10^12 never ended the draft loop and ``eagle_topk`` 10^12 asked for a 1 TiB mask."""
EAGLE_GRAPH_IO = {
    "eagle_model": (("input_embed", "hidden_states", "attention_mask", "position_ids", "logits_index"),
                    ("logits", "out_hidden_states")),
    "eagle_fc": (("fc_hidden",), ("hidden_states",)),
}  # fmt: skip
"""The inputs and outputs MNN's engine loads each Eagle draft graph with (``eagle.cpp``, ``Module::load``)."""
MAX_DRAFT_LENGTH = 64
"""The longest ``draft_predict_length`` taken (spec and config alike): each speculative bundle compiles one more graph
per plugin at that length + 1, and 10^12 never ended the runtime's draft loop."""
LOOKAHEAD_DEFAULTS: dict[str, object] = {
    "draft_match_strictness": "low",
    "draft_selection_rule": "freqxlen",
    "ngram_match_maxlen": 4,
    "ngram_update": False,
}
"""lookahead's settings and their engine defaults (``llmconfig.hpp``), written out so the bundle says what it runs."""
LOOKAHEAD_CHOICES: dict[str, tuple[str, ...]] = {
    "draft_match_strictness": ("low", "medium", "high"),
    "draft_selection_rule": ("freqxlen", "fcfs"),
}
"""The names ``lookahead.cpp`` knows; any other value (another case, a number, null) it warns about and replaces
with its default, so a bundle would say one setting and run another."""
NGRAM_KEY_MAX = 8
"""The longest n-gram key the engine holds (``MNN_NGRAM_KEY_MAX``): a longer ``ngram_match_maxlen`` overruns its
key array (it only warns), and 0 or less never drafts."""
ENGINE_RUN_FIELDS = frozenset(
    {
        "chunk_limits",
        "chunk",
        SPECULATIVE_TYPE,
        DRAFT_LENGTH_FIELD,
        "hidden_states",
        "mtp_model",
        *EAGLE_FILE_FIELDS,
        *EAGLE_TREE_DEFAULTS,
    }  # fmt: skip
)
"""Config fields that decide which forwards MNN's engine runs (and so which graphs a bundle needs) even when the
bundle's config leaves them out: ``llm_config.json`` must not set them, since the engine merges it over the config."""

LOOKUP_FILE_FIELD = "lookup_file"
DEFAULT_LOOKUP_FILE = "lookup_file.txt"
"""lookahead's optional prior-text file, read when present."""
LOOKUP_FILE_MAX_BYTES = 1 << 20
"""The largest lookup file taken (1 MiB). MNN's engine reads it whole, tokenizes it and counts its n-grams again at
every generation; prior text is a few KB, and 1 MiB of text (515k tokens of the tiny Qwen3 tokenizer) already took
the runtime's drafter 5 s per generation to count (4 MiB: 20 s)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is a Python int


def draft_length(config: Mapping[str, Any], where: object) -> int:
    """``draft_predict_length`` of a config that speculates (``where``: the file it is read from): 1 ...
    :data:`MAX_DRAFT_LENGTH`, the engine's 3 when unset. ValueError naming ``where`` and the field otherwise (the
    engine reads a string or null as 0 and a float with ``GetInt64``)."""
    value = config.get(DRAFT_LENGTH_FIELD, DEFAULT_DRAFT_LENGTH)
    if not _is_int(value) or not 1 <= value <= MAX_DRAFT_LENGTH:
        raise ValueError(
            f"{where}: field {DRAFT_LENGTH_FIELD!r} must be a positive integer at most {MAX_DRAFT_LENGTH}, "
            f"got {value!r}"
        )
    return int(value)


def lookahead_settings(sources: Sequence[tuple[object, Mapping[str, Any]]]) -> dict[str, Any]:
    """lookahead's settings as MNN's engine runs them: ``sources`` are the config and then the ``llm_config.json``
    it names (each ``(file, fields)``), whose fields win, as the engine merges it in. Every one is checked (the
    names of :data:`LOOKAHEAD_CHOICES`, ``ngram_match_maxlen`` 1 ... :data:`NGRAM_KEY_MAX`, ``ngram_update`` a JSON
    boolean, ``lookup_file`` a string) and unset ones are the engine's defaults; a bad one is a ValueError naming the
    file it came from and the field. ``lookup_file`` is returned as the name given: where it may point is the
    caller's rule (a model dir's file name, or a bundle path)."""
    got: dict[str, Any] = {**LOOKAHEAD_DEFAULTS, LOOKUP_FILE_FIELD: DEFAULT_LOOKUP_FILE}
    for where, fields in sources:
        for field, choices in LOOKAHEAD_CHOICES.items():
            if field in fields and fields[field] not in choices:
                raise ValueError(
                    f"{where}: field {field!r} must be one of {', '.join(repr(c) for c in choices)} (MNN's engine "
                    f"runs its default {LOOKAHEAD_DEFAULTS[field]!r} for anything else), got {fields[field]!r}"
                )
        value = fields.get("ngram_match_maxlen", 1)
        if not _is_int(value) or not 1 <= value <= NGRAM_KEY_MAX:
            raise ValueError(
                f"{where}: field 'ngram_match_maxlen' must be a positive int and at most {NGRAM_KEY_MAX} (the "
                f"engine's longest key), got {value!r}"
            )
        if not isinstance(fields.get("ngram_update", False), bool):
            raise ValueError(f"{where}: field 'ngram_update' must be true or false, got {fields['ngram_update']!r}")
        if not isinstance(fields.get(LOOKUP_FILE_FIELD, ""), str):
            raise ValueError(
                f"{where}: field {LOOKUP_FILE_FIELD!r} must be a file name, got {fields[LOOKUP_FILE_FIELD]!r}"
            )
        got.update({k: fields[k] for k in got if k in fields})
    return got


def read_lookup_file(path: Path, *, follow: bool = True) -> str | None:
    """The text of lookahead's lookup file at ``path`` (None: there is none, which the engine allows), read without
    waiting on it: a regular file of at most :data:`LOOKUP_FILE_MAX_BYTES` of UTF-8 text (``follow=False``: not
    through a link). A directory, FIFO or device is refused unread (the engine's ``ifstream`` waits on a FIFO for
    ever and reads ``/dev/zero`` until memory runs out), and so are larger files and other bytes: MNNFormatError
    naming the file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symlink; a bundle's files are copies" if exc.errno == errno.ELOOP else exc.strerror
        raise MNNFormatError(f"{path}: cannot open the lookup file: {why}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise MNNFormatError(
            f"{path}: the lookup file is not a regular file (a directory, FIFO or device); expected a text file of "
            "prior text, or none"
        )
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(LOOKUP_FILE_MAX_BYTES + 1)
    if len(data) > LOOKUP_FILE_MAX_BYTES:
        raise MNNFormatError(
            f"{path}: the lookup file holds {info.st_size} bytes, more than the {LOOKUP_FILE_MAX_BYTES} taken (MNN's "
            "engine reads it whole and counts its n-grams at every generation); expected prior text of at most 1 MiB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MNNFormatError(
            f"{path}: the lookup file is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); "
            "expected prior text for the tokenizer"
        ) from None


def read_draft_map(path: Path) -> np.ndarray:
    """``eagle_d2t``'s draft-id -> target-id offsets (target id = ``d + d2t[d]``), read from the file's flatbuffer,
    which must hold one int32 tensor: MNN's ``Variable::load`` crashes (SIGSEGV) on an empty or truncated file, and
    the engine indexes the tensor unchecked."""
    import numpy as np

    from mnnbuild.mnn._generated import mnn_fb as fb  # the schema: only here
    from mnnbuild.mnn.model import load_model

    model = load_model(path)
    blob = model.ops[0].main if len(model.ops) == 1 and model.ops[0].type == "Const" else None
    values = getattr(blob, "int32s", None)
    dims = [int(d) for d in getattr(blob, "dims", None) or []]
    if blob is None or getattr(blob, "dataType", None) != fb.DataType.DT_INT32 or values is None or not len(values):
        raise MNNFormatError(f"{path}: expected one int32 tensor of draft -> target id offsets (eagle_d2t)")
    if math.prod(dims) != len(values):
        raise MNNFormatError(f"{path}: its tensor has dims {dims} but {len(values)} values")
    return np.asarray(values, dtype=np.int64).reshape(-1)


def eagle_tree_tokens(config: dict) -> int:
    """How many draft tokens an Eagle tree can hold (``tokentree.hpp``): ``topk`` at the first level, then
    ``topk * topk`` per further level of ``eagle_depth``; the engine verifies at most that many."""
    depth = config.get("eagle_depth", EAGLE_TREE_DEFAULTS["eagle_depth"])
    topk = config.get("eagle_topk", EAGLE_TREE_DEFAULTS["eagle_topk"])
    return topk + topk * topk * (depth - 1)
