"""fetch: linking local models, and Hugging Face models from a pre-populated offline cache."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from mnnbuild.base.errors import ModelDirError
from mnnbuild.base.fsutil import sha256_file
from mnnbuild.model.modeldir import read_model_config
from mnnbuild.model.spec import LocalSource
from mnnbuild.stages.fetch import FetchInputs, FetchManifest, FetchParams, HfLock, fetch
from tests.conftest import TINY_MODEL_DIR, RunDoit, executed_tasks, skipped_tasks


def fetch_local(src: Path, out: Path) -> FetchManifest:
    return fetch(FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src), FetchParams(), out)


def copy_model(tmp_path: Path) -> Path:
    dst = tmp_path / "src-model"
    shutil.copytree(TINY_MODEL_DIR, dst)
    return dst


def test_local_fetch_links_and_hashes(tmp_path: Path) -> None:
    out = tmp_path / "model"
    manifest = fetch_local(TINY_MODEL_DIR, out)
    names = {r.path for r in manifest.outputs}
    assert {"llm.mnn", "llm.mnn.weight", "llm_config.json", "config.json"} <= names
    assert names & {"tokenizer.txt", "tokenizer.mtok"}
    for rec in manifest.outputs:
        link = out / rec.path
        assert link.is_symlink(), "model files are linked, never copied"
        assert link.resolve() == (TINY_MODEL_DIR / rec.path).resolve()
        assert rec.sha256 == sha256_file(TINY_MODEL_DIR / rec.path)
        assert rec.size == (TINY_MODEL_DIR / rec.path).stat().st_size
    assert FetchManifest.read(out) == manifest
    assert manifest.tools["mnnbuild"]


def test_missing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="does-not-exist.*model directory does not exist"):
        fetch_local(tmp_path / "does-not-exist", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: (d / "llm.mnn.weight").unlink(), "required file llm.mnn.weight is missing"),
        (lambda d: (d / "llm.mnn.weight").write_bytes(b""), "weight file is empty"),
        (lambda d: (d / "llm_config.json").write_text('{"attention_mask": "float"}'), "field 'hidden_size'"),
        (lambda d: (d / "llm_config.json").write_text('{"hidden_size": 128}'), "field 'attention_mask'"),
        (lambda d: (d / "llm_config.json").write_text("{nope"), "not valid JSON"),
        (lambda d: [p.unlink() for p in d.glob("tokenizer.*")], "no tokenizer file"),
    ],
)
def test_bad_model_dir_leaves_nothing(tmp_path: Path, mutate, expected: str) -> None:  # noqa: ANN001
    src = copy_model(tmp_path)
    out = tmp_path / "out"
    fetch_local(src, out)
    before = sorted(p.name for p in out.iterdir())
    mutate(src)
    with pytest.raises(ModelDirError, match=expected):
        fetch_local(src, out)
    # the previous good output is untouched and no temp dir is left behind
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "{path}: file missing; an MNN LLM directory must have config.json"),
        (
            b"{nope",
            "{path}: not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b"\xff{}", "{path}: not valid JSON: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        (b"[1]", "{path}: expected a JSON object, got list"),
        ("a directory", "{path}: cannot read: [Errno 21] Is a directory: '{path}'"),
    ],
    ids=["missing", "not-json", "not-utf8", "not-an-object", "a-directory"],
)
def test_model_config_problems_are_one_line(tmp_path: Path, content: bytes | str | None, expected: str) -> None:
    path = tmp_path / "config.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.mkdir()
    with pytest.raises(ModelDirError) as exc:
        read_model_config(tmp_path)
    assert str(exc.value) == expected.format(path=path)


def make_hf_cache(cache: Path, repo: str, files: dict[str, bytes], commit: str = "a" * 40) -> str:
    """Write a repo into an HF hub cache in huggingface-hub's layout (blobs, snapshots, refs)."""
    org, name = repo.split("/")
    root = cache / f"models--{org}--{name}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir()
    for fname, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / fname).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return commit


def tiny_files() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in TINY_MODEL_DIR.iterdir() if p.is_file() and p.name != "README.md"}


def hf_spec(directory: Path, repo: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "fake-hf.toml"
    spec.write_text(f'name = "fake-hf"\nsource = {{ hf = "{repo}" }}\nchunk_size = 8\ntargets = ["v79"]\n')
    return spec


@pytest.mark.slow
def test_hf_fetch_offline_from_cache(tmp_path: Path, run_doit: RunDoit) -> None:
    cache = tmp_path / "hf-cache"
    commit = make_hf_cache(cache, "acme/tiny-mnn", {**tiny_files(), "README.md": b"not needed"})
    spec = hf_spec(tmp_path / "specs", "acme/tiny-mnn")
    env = {"MNNBUILD_MODELS_PATH": str(spec.parent), "HF_HUB_CACHE": str(cache)}
    proc = run_doit("fetch:fake-hf", env=env)
    assert executed_tasks(proc.stdout) == ["fetch:fake-hf"]
    out = tmp_path / "artifacts" / "fake-hf" / "model"
    manifest = FetchManifest.read(out)
    assert manifest.source.kind == "hf" and manifest.source.commit == commit
    assert not (out / "README.md").exists(), "only the files the chain needs are linked"
    assert (out / "llm.mnn.weight").resolve().parent.name == "blobs"
    lock = HfLock.model_validate_json(spec.with_suffix(".lock.json").read_text())
    assert lock == HfLock(repo="acme/tiny-mnn", revision="main", commit=commit)
    # pinned: a second run does nothing
    again = run_doit("fetch:fake-hf", env=env)
    assert executed_tasks(again.stdout) == [] and skipped_tasks(again.stdout) == ["fetch:fake-hf"]


@pytest.mark.slow
def test_hf_fetch_missing_file_names_file_and_repo(tmp_path: Path, run_doit: RunDoit) -> None:
    cache = tmp_path / "hf-cache"
    files = tiny_files()
    del files["llm.mnn.weight"]
    make_hf_cache(cache, "acme/broken", files)
    spec = hf_spec(tmp_path / "specs", "acme/broken")
    env = {"MNNBUILD_MODELS_PATH": str(spec.parent), "HF_HUB_CACHE": str(cache)}
    proc = run_doit("fetch:fake-hf", env=env, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "acme/broken" in text and "llm.mnn.weight is missing" in text
    assert "Traceback" not in text
    assert not (tmp_path / "artifacts" / "fake-hf" / "model").exists()


@pytest.mark.slow
def test_hf_fetch_not_in_cache_is_clear(tmp_path: Path, run_doit: RunDoit) -> None:
    spec = hf_spec(tmp_path / "specs", "acme/absent")
    env = {"MNNBUILD_MODELS_PATH": str(spec.parent), "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    proc = run_doit("fetch:fake-hf", env=env, check=False)
    assert proc.returncode != 0
    assert "HF repo acme/absent@main: not in the local Hugging Face cache" in proc.stdout + proc.stderr


BLOCKED_RESOLVER = """
import socket


def _blocked(*args, **kwargs):
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


socket.getaddrinfo = _blocked
"""
"""A ``sitecustomize`` whose resolver fails every lookup, as a box without DNS does (no packet leaves)."""


@pytest.mark.slow
@pytest.mark.parametrize("offline", ["1", "0"])
def test_hf_fetch_says_why_it_could_not_download(tmp_path: Path, run_doit: RunDoit, offline: str) -> None:
    """A model not in the HF cache: with HF_HUB_OFFLINE set the line says so; without it, on a box whose resolver
    fails (DNS down), it names the endpoint and the resolver's error, and never blames HF_HUB_OFFLINE."""
    spec = hf_spec(tmp_path / "specs", "acme/absent")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKED_RESOLVER)
    env = {"MNNBUILD_MODELS_PATH": str(spec.parent), "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    env.update({"HF_HUB_OFFLINE": offline, "PYTHONPATH": str(site), "NO_PROXY": "*", "no_proxy": "*"})
    proc = run_doit("fetch:fake-hf", env=env, check=False)
    assert proc.returncode != 0
    (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if "HF repo acme/absent@main" in x]
    assert line.startswith("ModelDirError: HF repo acme/absent@main: not in the local Hugging Face cache")
    if offline == "1":
        assert "downloads are off (HF_HUB_OFFLINE is set)" in line, line
    else:
        assert "HF_HUB_OFFLINE" not in line, line
        assert "https://huggingface.co could not be reached (gaierror: [Errno -2] Name or service not known)" in line
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_update_moves_the_pin(tmp_path: Path, run_doit: RunDoit) -> None:
    cache = tmp_path / "hf-cache"
    first = make_hf_cache(cache, "acme/moving", tiny_files(), commit="a" * 40)
    spec = hf_spec(tmp_path / "specs", "acme/moving")
    env = {"MNNBUILD_MODELS_PATH": str(spec.parent), "HF_HUB_CACHE": str(cache)}
    run_doit("fetch:fake-hf", env=env)
    # the repo's main moves on (as seen by the offline cache)
    second = "b" * 40
    repo = cache / "models--acme--moving"
    (repo / "snapshots" / first).rename(repo / "snapshots" / second)
    (repo / "snapshots" / first).mkdir()
    for link in (repo / "snapshots" / second).iterdir():
        (repo / "snapshots" / first / link.name).symlink_to(link.readlink())
    (repo / "refs" / "main").write_text(second)
    # pinned: fetch stays on the locked commit and does nothing
    assert executed_tasks(run_doit("fetch:fake-hf", env=env).stdout) == []
    assert HfLock.model_validate_json(spec.with_suffix(".lock.json").read_text()).commit == first
    # an explicit update moves the pin, and the next fetch follows it
    run_doit("update:fake-hf", env=env)
    assert HfLock.model_validate_json(spec.with_suffix(".lock.json").read_text()).commit == second
    assert executed_tasks(run_doit("fetch:fake-hf", env=env).stdout) == ["fetch:fake-hf"]
    assert FetchManifest.read(tmp_path / "artifacts" / "fake-hf" / "model").source.commit == second


FIXTURES = TINY_MODEL_DIR.parent.parent / "tests" / "fixtures" / "models"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "body", "expected"),
    [
        pytest.param(
            FIXTURES / "qwen2.5-vl-tiny",
            "",
            "llm_config.json field 'is_visual' is true: the model is a vision-language model, but its spec says "
            "family = 'llm'; set spec field family = 'vl', visual_encoder = 'qwen2.5-vl' and image_sizes",
            id="vl-built-as-llm",
        ),
        pytest.param(
            FIXTURES / "qwen3-embedding-tiny",
            "",
            "embedding.mnn outputs 'sentence_embeddings': the model is an embedding model, but its spec says "
            "family = 'llm'; set spec field family = 'embedding'",
            id="embedding-built-as-llm",
        ),
        pytest.param(
            TINY_MODEL_DIR,
            'family = "vl"\nvisual_encoder = "qwen3-vl"\nimage_sizes = ["64x64"]',
            "llm.mnn outputs ['logits', 'hidden_states'] and llm_config.json has no 'is_visual': true: the model is "
            "a text LLM, but its spec says family = 'vl'; set spec field family = 'llm'",
            id="llm-built-as-vl",
        ),
        pytest.param(
            FIXTURES / "qwen3-vl-tiny",
            'family = "embedding"',
            "llm_config.json field 'is_visual' is true: the model is a vision-language model, but its spec says "
            "family = 'embedding'; set spec field family = 'vl', visual_encoder = 'qwen3-vl' and image_sizes",
            id="vl-built-as-embedding",
        ),
    ],
)
def test_the_family_is_read_from_the_model(
    run_doit: RunDoit, tmp_path: Path, model: Path, body: str, expected: str
) -> None:
    """A VL model built as a text LLM shipped without its encoder and passed verify; an embedding model built as one
    failed in io on its mask. The model's files say which family it is: fetch says so, in one line, before anything
    is built."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "m.toml").write_text(f'name = "m"\nsource = {{ local = "{model}" }}\ntargets = ["v79"]\n{body}\n')
    proc = run_doit("io:m", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    lines = [line for line in out.splitlines() if "the model is" in line]
    assert len(lines) == 1, out
    assert lines[0] == f"ModelDirError: model directory {model} (source of m): {expected}", lines[0]
    assert not (tmp_path / "artifacts" / "m" / "model").exists()


def test_an_audio_model_is_refused_by_every_family(tmp_path: Path) -> None:
    import json

    src = copy_model(tmp_path)
    config = json.loads((src / "llm_config.json").read_text())
    (src / "llm_config.json").write_text(json.dumps({**config, "is_audio": True}))
    with pytest.raises(ModelDirError) as err:
        fetch_local(src, tmp_path / "out")
    assert str(err.value).endswith(
        "llm_config.json field 'is_audio' is true: MNN's engine runs it as an omni model (audio in or out), which no "
        "spec family builds; expected a text LLM, a vision-language or an embedding model"
    )


@pytest.mark.slow
def test_a_wrong_hidden_size_is_named_as_such(run_doit: RunDoit, tmp_path: Path) -> None:
    """hidden_size sizes io's embeddings: a wrong one made MNN fail inside the graph, blamed on the weight file."""
    import json

    src = copy_model(tmp_path)
    config = json.loads((src / "llm_config.json").read_text())
    (src / "llm_config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "m.toml").write_text(f'name = "m"\nsource = {{ local = "{src}" }}\ntargets = ["v79"]\n')
    proc = run_doit("io:m", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out and "weight file" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("ModelDirError")]
    assert lines == [
        f"ModelDirError: {src / 'llm_config.json'}: field 'hidden_size' is 64, but llm.mnn takes input_ids of width "
        "128 (its hidden size); expected hidden_size = 128"
    ], out
