"""The tokenizer file is read and checked before MNN's engine sees it (issue 43, item 3): MNN's engine crashed
(SIGSEGV, nothing printed) on an empty or foreign ``tokenizer.mtok``."""

from __future__ import annotations

import base64
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn.tokenizer import MAX_TOKENIZER_BYTES, check_tokenizer
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR, RunDoit

TINY_MTOK = TINY_MODEL_DIR / "tokenizer.mtok"
VOCAB_AT = 10558
"""Byte offset of the tiny tokenizer's vocabulary size (a u32 after the normalizer and pre-tokenizer records)."""
TAIL_AT = 29946
"""Where its optional tail (chat template ...) starts: every shorter cut lacks a part the engine reads."""


def refused(path: Path) -> str:
    with pytest.raises(MNNFormatError) as info:
        check_tokenizer(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


def test_the_shipped_tokenizers_are_read_whole() -> None:
    assert check_tokenizer(TINY_MTOK).vocab_size == 1024
    trained = check_tokenizer(PROJECT_ROOT / "models" / "tiny-qwen3-trained" / "tokenizer.mtok")
    assert (trained.kind, trained.vocab_size, trained.special_ids) == ("pipeline (.mtok)", 2048, (0, 2, 1, 2))
    assert TINY_MTOK.read_bytes()[VOCAB_AT : VOCAB_AT + 4] == struct.pack("<I", 1024)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "is empty; expected an MNN tokenizer, first line '430 <kind>'"),
        (bytes(range(256)) * 120, "is not an MNN tokenizer: its first line is"),
        (b"430 9\n0 0 0\n\n", "tokenizer kind 9 (line 1) is none MNN's engine reads"),
        (b"430 1\n1 0 0\n\n", "line 3 (special, stop, prefix token ids) must be 1 integers, got 0"),
        (b"430 1\n0 0 0\n\n5\nYQ==\n", "line 4: vocabulary size is 5, but the file has room for 1 to 1"),
        (b"430 1\n0 0 0\n\n-1\n", "line 4: vocabulary size is -1"),
        (b"430 1\n1 0 0\n7\n1\nYQ==\n", "line 3: token id 7 is not in the vocabulary (0 .. 0)"),
        (b"430 0\n0 0 0\n\n1\nYQ== nan 1\n", "line 5: expected a finite score and a piece type 1-6"),
        (b"430 3\n0 0 0\n\n1 1\na\nab\n", "line 6: a merge must be two tokens separated by a space"),
    ],
    ids=[
        "empty",
        "random",
        "kind-9",
        "ids-missing",
        "vocab-past-end",
        "vocab-negative",
        "id-past-vocab",
        "nan-score",
        "bad-merge",
    ],  # fmt: skip
)
def test_bad_tokenizers_are_one_line(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(data)
    assert expected in refused(path)


def test_text_kinds_mnn_reads_are_taken(tmp_path: Path) -> None:
    a, b = (base64.b64encode(t).decode() for t in (b"a", b"b"))
    kinds = {
        0: f"2\n{a} -1.5 1\n{b} 0 2\n",
        1: f"2\n{a}\n{b}\n",
        2: f"2\n{a}\n{b}\n",
        3: "3 1\na\nb\nab\na b\n",
    }
    for kind, vocab in kinds.items():
        path = tmp_path / f"{kind}.txt"
        path.write_text(f"430 {kind}\n1 1 0\n0 1\n{vocab}")
        assert check_tokenizer(path).vocab_size == (3 if kind == 3 else 2)


@pytest.mark.slow
def test_every_cut_of_an_mtok_before_its_optional_tail_is_refused(tmp_path: Path) -> None:
    data = TINY_MTOK.read_bytes()
    path = tmp_path / "tokenizer.mtok"
    for cut in [*range(1, TAIL_AT, 97), TAIL_AT - 1, TAIL_AT + 20]:
        path.write_bytes(data[:cut])
        refused(path)
    path.write_bytes(data[:TAIL_AT])  # the tail is optional: the engine reads it only when bytes are left
    assert check_tokenizer(path).vocab_size == 1024


@pytest.mark.parametrize(
    ("at", "value", "expected"),
    [
        (
            VOCAB_AT,
            0xFFFFFFF0,
            "vocabulary size at byte 10558 is 4,294,967,280; the 19,598 bytes left hold at most 3,266 tokens",
        ),
        (VOCAB_AT + 4 + 2 + 4 + 2 + 1, 5000, "token id 5000 at byte 10571 is not below the vocabulary size 1024"),
    ],
    ids=["vocab-size", "token-id"],
)
def test_binary_counts_and_ids_past_the_data_are_refused(tmp_path: Path, at: int, value: int, expected: str) -> None:
    """The engine sizes its tables by these and writes a token at its id: either one past the data wrote out of
    bounds. (The first token of the tiny vocabulary is one byte long: its id follows 2 + 1 bytes.)"""
    data = bytearray(TINY_MTOK.read_bytes())
    assert data[VOCAB_AT + 10 : VOCAB_AT + 12] == b"\x01\x00", "the first token is one byte long"
    data[at : at + 4] = struct.pack("<I", value)
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(bytes(data))
    assert expected in refused(path)


def test_a_huge_tokenizer_is_refused_unread(tmp_path: Path) -> None:
    """MNN's engine holds the file whole and builds its tables from it: a 200 MB one took 1.6 GB and 6 s to load."""
    path = tmp_path / "tokenizer.mtok"
    with path.open("wb") as fh:
        fh.write(b"430 1\n0 0 0\n\n")
        fh.truncate(MAX_TOKENIZER_BYTES + 1)  # sparse: nothing to read if it were read
    assert f"is {MAX_TOKENIZER_BYTES + 1:,} bytes, more than the {MAX_TOKENIZER_BYTES:,}" in refused(path)
    fifo = tmp_path / "fifo.mtok"
    os.mkfifo(fifo)
    assert "is not a regular file" in refused(fifo)


def bad_tokenizer_model(tmp_path: Path, data: bytes) -> Path:
    model = tmp_path / "model"
    shutil.copytree(TINY_MODEL_DIR, model)
    (model / "tokenizer.mtok").write_bytes(data)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("data", [b"", bytes(range(256)) * 120], ids=["empty", "random-30k"])
def test_doit_io_on_a_bad_tokenizer_is_one_line(run_doit: RunDoit, tmp_path: Path, data: bytes) -> None:
    """Issue 43's case: `doit io:m` died with SIGSEGV (rc 139) and printed nothing but the task."""
    model = bad_tokenizer_model(tmp_path, data)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "m.toml").write_text(f'name = "m"\nsource = {{ local = "{model}" }}\ntargets = ["v79"]\n')
    proc = run_doit("io:m", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert f"ModelDirError: {model / 'tokenizer.mtok'}: is " in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_runtime_checks_the_tokenizer_before_mnn_reads_it(tmp_path: Path) -> None:
    """A bundle (or model dir) whose tokenizer was swapped after it was built: a BundleError, not a crash (run in a
    child: the crash took the process with it)."""
    model = bad_tokenizer_model(tmp_path, b"")
    code = (
        "from mnnbuild_runtime import BundleError, Tokenizer\n"
        f"try:\n    Tokenizer({str(model / 'config.json')!r})\n"
        "except BundleError as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "runtime")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.strip() == f"{model / 'tokenizer.mtok'}: is empty; expected an MNN tokenizer, first line " \
        "'430 <kind>' as MNN's llmexport writes"  # fmt: skip


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused(tmp_path: Path) -> None:
    """The trained model's tokenizer (2048 tokens) on the tiny model (1024 embedding rows): MNN's engine embeds ids
    past its table without a word (it read other bytes of the weight file for them)."""
    from mnnbuild.base.errors import ModelDirError
    from mnnbuild.model.modeldir import validate_model_dir

    model = bad_tokenizer_model(
        tmp_path, (PROJECT_ROOT / "models" / "tiny-qwen3-trained" / "tokenizer.mtok").read_bytes()
    )
    with pytest.raises(ModelDirError) as info:
        validate_model_dir(model)
    assert str(info.value) == (
        f"{model / 'tokenizer.mtok'}: gives token ids up to 2047, but the model's embeddings (llm.mnn.weight) have "
        "1024 rows; expected this model's tokenizer"
    )
    assert check_tokenizer(TINY_MTOK).largest_id == 1023
