"""MNN's tokenizer files (``tokenizer.txt``, ``tokenizer.mtok``), read and checked before MNN's engine loads one.

MNN's engine (``transformers/llm/engine/src/tokenizer/tokenizer.cpp``) trusts the file: an empty or foreign file
leaves it without a tokenizer, and a count or token id past the data makes it read or write out of bounds; either
is a SIGSEGV with nothing printed. So every count, length, kind and token id the engine will use is checked here
against the bytes that are there, and the first that does not fit is one line naming the file.

The layout, as the engine reads it: three text lines, ``430 <kind>`` (kind 0 SentencePiece, 1 Tiktoken, 2 BERT
WordPiece, 3 Hugging Face BPE, 4 the binary pipeline of ``.mtok``), ``<special> <stop> <prefix>`` counts and a line
of that many token ids; then the vocabulary, as text lines (kinds 0-3) or binary records (kind 4: normalizer,
pre-tokenizer, model, decoder, added tokens, then optional chat template, eos, flags, bos, post-processor).
"""

from __future__ import annotations

import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnnbuild.base.errors import MNNFormatError

MAGIC = 430
KINDS = {0: "SentencePiece", 1: "Tiktoken", 2: "BERT", 3: "Hugging Face BPE", 4: "pipeline (.mtok)"}
PIPELINE = 4
MAX_TOKENIZER_BYTES = 64 << 20
"""The largest tokenizer file accepted. Real ones are a few MB (Qwen3's 151,669 tokens with their merges: about
4 MB as ``.mtok``); MNN's engine holds the whole file in memory and builds its tables from it at every load (a
200 MB file: see docs/guarantees.md), so anything this large is not a tokenizer."""
MAX_NESTING = 16
"""Sequences of normalizers, pre-tokenizers or decoders nest; the engine reads them by recursion."""
SENTENCEPIECE_PIECE_TYPES = range(1, 7)  # NORMAL .. BYTE
POST_OP_SEQUENCE, POST_OP_SPECIAL = 0, 1


@dataclass(frozen=True)
class TokenizerInfo:
    kind: str
    vocab_size: int
    special_ids: tuple[int, ...]
    largest_id: int
    """The largest id it can give (its vocabulary's or an added token's): the model must have an embedding row
    for it, which MNN's engine reads unchecked."""


class _Bad(Exception):
    """What is wrong, without the file name (added once, by `check_tokenizer`)."""


def _read_regular(path: Path) -> bytes:
    """The file's bytes, once it is a regular file no larger than `MAX_TOKENIZER_BYTES` (a FIFO is not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _Bad("is not a regular file")
        if st.st_size > MAX_TOKENIZER_BYTES:
            raise _Bad(f"is {st.st_size:,} bytes, more than the {MAX_TOKENIZER_BYTES:,} a tokenizer may have")
        return fh.read(MAX_TOKENIZER_BYTES + 1)


def _ints(line: bytes, what: str, count: int | None = None) -> list[int]:
    try:
        values = [int(v) for v in line.split()]
    except ValueError:
        raise _Bad(f"{what} must be integers, got {line[:60]!r}") from None
    if count is not None and len(values) != count:
        raise _Bad(f"{what} must be {count} integers, got {len(values)} ({line[:60]!r})")
    return values


class _Lines:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.number = data, 0, 0

    def next(self, what: str) -> bytes:
        if self.pos >= len(self.data):
            raise _Bad(f"ends before {what} (line {self.number + 1})")
        end = self.data.find(b"\n", self.pos)
        end = len(self.data) if end < 0 else end
        line, self.pos = self.data[self.pos : end], end + 1
        self.number += 1
        return line.rstrip(b"\r")

    def left(self) -> int:
        """Lines after the current one (the last may lack its newline)."""
        return self.data.count(b"\n", self.pos) + (0 if self.data.endswith(b"\n") or self.pos >= len(self.data) else 1)


def _count_fits(n: int, what: str, available: int, least: int = 0) -> int:
    """A count of lines that must lie in the ``available`` lines left (a vocabulary has at least one token)."""
    if n < least or n > available:
        raise _Bad(f"{what} is {n}, but the file has room for {least} to {available}")
    return n


def _text_vocab(lines: _Lines, kind: int) -> int:
    if kind == 3:  # "<vocab> <merges>", the tokens as UTF-8 lines, then "a b" merge lines
        vocab, merges = _ints(lines.next("the vocabulary counts"), f"line {lines.number} (vocabulary, merges)", 2)
        _count_fits(vocab, f"line {lines.number}: vocabulary size", lines.left(), least=1)
        _count_fits(merges, f"line {lines.number}: merge count", lines.left() - vocab)
        for _ in range(vocab):
            lines.next("the vocabulary")
        for _ in range(merges):
            if b" " not in lines.next("the merges"):
                raise _Bad(f"line {lines.number}: a merge must be two tokens separated by a space")
        return vocab
    (vocab,) = _ints(lines.next("the vocabulary size"), f"line {lines.number} (vocabulary size)", 1)
    _count_fits(vocab, f"line {lines.number}: vocabulary size", lines.left(), least=1)
    for _ in range(vocab):
        line = lines.next("the vocabulary")
        if kind == 0:  # "<base64 piece> <score> <piece type>"
            parts = line.split(b" ")
            if len(parts) != 3:
                raise _Bad(f"line {lines.number}: a SentencePiece entry must be '<piece> <score> <type>'")
            try:
                score, piece_type = float(parts[1]), int(parts[2])
            except ValueError:
                raise _Bad(f"line {lines.number}: score and type must be numbers, got {line[:60]!r}") from None
            if not math.isfinite(score) or piece_type not in SENTENCEPIECE_PIECE_TYPES:
                raise _Bad(f"line {lines.number}: expected a finite score and a piece type 1-6, got {line[:60]!r}")
    return vocab


class _Bytes:
    """A bounded little-endian reader of the ``.mtok`` records."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def left(self) -> int:
        """Lines after the current one (the last may lack its newline)."""
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise _Bad(f"{what} needs {n} bytes at byte {self.pos}, but the file ends {self.left()} bytes later")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(struct.unpack("<H", self.take(2, what))[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])

    def f64(self, what: str) -> float:
        return float(struct.unpack("<d", self.take(8, what))[0])

    def string(self, what: str) -> bytes:
        return self.take(self.u16(f"{what}'s length"), what)

    def count(self, what: str, each: int) -> int:
        """A u32 count of records at least ``each`` bytes long, which must fit what is left."""
        at = self.pos
        n = self.u32(what)
        if n * each > self.left():
            raise _Bad(f"{what} at byte {at} is {n:,}, more than the {self.left():,} bytes left can hold")
        return n


def _pipeline_part(buf: _Bytes, part: str, kinds: dict[int, tuple[str, ...]], sequence: int, depth: int = 0) -> None:
    """A normalizer, pre-tokenizer or decoder: a kind byte, its fields (``kinds``), or a nested sequence."""
    if depth > MAX_NESTING:
        raise _Bad(f"{part}s nest deeper than {MAX_NESTING} sequences")
    at = buf.pos
    kind = buf.u8(f"the {part} kind")
    if kind == sequence:
        for _ in range(buf.count(f"the {part} sequence length", 1)):
            _pipeline_part(buf, part, kinds, sequence, depth + 1)
        return
    if kind not in kinds:
        raise _Bad(f"{part} kind {kind} at byte {at} is none MNN's engine reads ({sorted([*kinds, sequence])})")
    for field in kinds[kind]:
        if field == "str":
            buf.string(f"a {part} string")
        elif field == "u8":
            buf.u8(f"a {part} flag")
        elif field == "u32":
            buf.u32(f"a {part} number")
        elif field == "table":  # code point -> replacement
            for _ in range(buf.count(f"the {part} table size", 6)):
                buf.u32(f"a {part} table code point")
                buf.string(f"a {part} table entry")
        elif field == "strip-table":  # Bert's NFD table, there only when its third flag (strip accents) is set
            if buf.data[buf.pos - 2]:
                for _ in range(buf.count(f"the {part} table size", 6)):
                    buf.u32(f"a {part} table code point")
                    buf.string(f"a {part} table entry")


NORMALIZERS = {0: (), 1: (), 2: ("str",), 3: ("str", "str"), 5: ("u8",) * 4, 6: ("table",),
               7: ("u8", "u8", "u8", "u8", "strip-table"), 8: ("u8", "u8")}  # fmt: skip
PRE_TOKENIZERS = {0: (), 1: ("u8",), 2: ("u8",), 3: ("str", "u8"), 4: ("str", "u8", "u8"), 5: ()}
DECODERS = {0: (), 1: (), 2: ("str", "u8"), 3: ("str", "u8"), 4: (), 5: ("str", "str"), 6: ("str", "u32", "u32")}


def _pipeline(buf: _Bytes) -> tuple[int, set[int]]:
    """The binary part of a ``.mtok``: its vocabulary size and the ids of its added tokens."""
    _pipeline_part(buf, "normalizer", NORMALIZERS, sequence=4)
    _pipeline_part(buf, "pre-tokenizer", PRE_TOKENIZERS, sequence=6)
    at = buf.pos
    model = buf.u8("the model kind")
    if model not in (0, 1, 2):
        raise _Bad(f"model kind {model} at byte {at} is none MNN's engine reads (0 BPE, 1 WordPiece, 2 Unigram)")
    vocab_at = buf.pos
    vocab = buf.u32("the vocabulary size")
    if model == 0:
        buf.take(2, "the BPE flags")
        merges = buf.u32("the merge count")
    elif model == 1:
        buf.string("the unknown token")
        buf.string("the subword prefix")
        buf.u32("the word length limit")
    else:
        unk = buf.u32("the unknown token id")
        buf.u8("the byte fallback flag")
        if unk >= vocab:
            raise _Bad(f"Unigram unknown token id {unk} is not below the vocabulary size {vocab}")
    entry = 6 + (8 if model == 2 else 0)
    if vocab == 0 or vocab * entry > buf.left():
        raise _Bad(f"vocabulary size at byte {vocab_at} is {vocab:,}; the {buf.left():,} bytes left hold at most "
                   f"{buf.left() // entry:,} tokens")  # fmt: skip
    for _ in range(vocab):
        buf.string("a token")
        token_id = buf.u32("a token id")
        if token_id >= vocab:  # the engine stores the token at this index of a table of vocab_size
            raise _Bad(f"token id {token_id} at byte {buf.pos - 4} is not below the vocabulary size {vocab}")
        if model == 2 and not math.isfinite(buf.f64("a token score")):
            raise _Bad(f"token score at byte {buf.pos - 8} is not finite")
    if model == 0:
        if merges * 12 > buf.left():
            raise _Bad(f"merge count is {merges:,}, more than the {buf.left():,} bytes left can hold")
        at = buf.pos
        pairs = np.frombuffer(buf.take(12 * merges, "the merges"), dtype="<u4").reshape(-1, 3)[:, :2]
        if pairs.size and int(pairs.max()) >= vocab:
            row = int(np.argmax(pairs.max(axis=1) >= vocab))
            raise _Bad(f"merge at byte {at + 12 * row} names token {int(pairs[row].max())}, not below {vocab}")
    _pipeline_part(buf, "decoder", DECODERS, sequence=7)
    added: set[int] = set()
    for _ in range(buf.count("the added token count", 9)):
        added.add(buf.u32("an added token id"))
        buf.take(3, "an added token's flags")
        buf.string("an added token")
    # the optional tail, each part only when bytes are left (the engine reads a part whole once it starts it)
    if buf.left():
        buf.take(buf.u32("the chat template length"), "the chat template")
    if buf.left():
        buf.string("the end-of-sequence text")
    if buf.left():
        buf.u8("the flags")
    if buf.left():
        buf.string("the beginning-of-sequence text")
    if buf.left():
        ops = buf.u16("the post-processor length")
        if buf.left() != 4 * ops:  # else ops of a kind byte each, a special token's followed by its id
            for _ in range(ops):
                op = buf.u8("a post-processor op")
                if op == POST_OP_SPECIAL:
                    added_id = buf.u32("a post-processor token id")
                    if added_id >= vocab and added_id not in added:
                        raise _Bad(f"post-processor token id {added_id} is neither a token nor an added token")
                elif op != POST_OP_SEQUENCE:
                    break  # the engine stops reading there too
    return vocab, added


def check_tokenizer(path: str | os.PathLike[str]) -> TokenizerInfo:
    """Read the tokenizer file at ``path`` as MNN's engine will, or raise `MNNFormatError` naming what is wrong."""
    path = Path(path)
    try:
        data = _read_regular(path)
        if not data:
            raise _Bad(f"is empty; expected an MNN tokenizer, first line '{MAGIC} <kind>' as MNN's llmexport writes")
        lines = _Lines(data)
        first = lines.next("the header")
        head = first.split()
        if len(head) < 2 or not head[0].isdigit() or int(head[0]) != MAGIC or not head[1].isdigit():
            shown = f"its first line is {first[:16]!r}"
            raise _Bad(f"is not an MNN tokenizer: {shown}; expected '{MAGIC} <kind>' as MNN's llmexport writes")
        kind = int(head[1])
        if kind not in KINDS:
            raise _Bad(f"tokenizer kind {kind} (line 1) is none MNN's engine reads: {KINDS}")
        counts = _ints(lines.next("the special token counts"), "line 2 (special, stop, prefix token counts)", 3)
        if min(counts) < 0:
            raise _Bad(f"line 2: token counts must not be negative, got {counts}")
        ids = _ints(lines.next("the special token ids"), "line 3 (special, stop, prefix token ids)", sum(counts))
        if kind == PIPELINE:
            vocab, added = _pipeline(_Bytes(data, lines.pos))
        else:
            vocab, added = _text_vocab(lines, kind), set()
        bad = [i for i in ids if not (0 <= i < vocab or i in added)]
        if bad:
            raise _Bad(f"line 3: token id {bad[0]} is not in the vocabulary (0 .. {vocab - 1})")
    except _Bad as exc:
        raise MNNFormatError(f"{path}: {exc}") from None
    except OSError as exc:
        raise MNNFormatError(f"{path}: cannot read the tokenizer: {exc.strerror or exc}") from None
    return TokenizerInfo(KINDS[kind], vocab, tuple(ids), max([vocab - 1, *added]))
