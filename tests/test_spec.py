"""Model specs, the SoC table and settings from the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mnnbuild.base.errors import SpecError
from mnnbuild.dag.project import Project
from mnnbuild.dag.tasks import stage_runs
from mnnbuild.manifests.bundle import BundleParams
from mnnbuild.model.spec import HfSource, LocalSource, discover_specs, load_spec
from mnnbuild.model.targets import SOCS, soc_for_arch
from mnnbuild.pipeline.fingerprint import DigestMemo
from mnnbuild.pipeline.layout import POSTREAT_FILE
from mnnbuild.pipeline.settings import Settings
from mnnbuild.stages.chain import CHAIN
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR


def write_spec(directory: Path, text: str, name: str = "m.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_specs() -> None:
    specs = discover_specs([PROJECT_ROOT / "models"])
    tiny, big = specs["tiny-qwen3"], specs["qwen3-1.7b"]
    assert isinstance(tiny.source, LocalSource)
    assert tiny.local_dir() == TINY_MODEL_DIR
    assert isinstance(big.source, HfSource) and big.source.hf == "taobao-mnn/Qwen3-1.7B-MNN"
    assert big.targets == ["v79"]
    assert big.soc("v79").name == "SM8750" and big.soc("v79").soc_id == 69


def test_soc_table_defaults_match_arch() -> None:
    for soc in SOCS:
        assert soc.vtcm_mb == 8
    assert soc_for_arch("v75").soc_id == 57
    assert soc_for_arch("v79", "SM8735").soc_id == 85
    with pytest.raises(KeyError, match="SM8650 is v75, not v79"):
        soc_for_arch("v79", "SM8650")


def test_spec_overrides_soc(tmp_path: Path) -> None:
    path = write_spec(tmp_path, 'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\nsocs = { v79 = "SM8735" }\n')
    spec = load_spec(path)
    assert spec.soc("v79").name == "SM8735"
    assert spec.local_dir() == tmp_path / "x"
    assert spec.lock_path == tmp_path / "m.lock.json"


@pytest.mark.parametrize(
    ("body", "field", "expected"),
    [
        ('targets = ["v99"]', "targets", "unknown target 'v99'; expected one of v69"),
        ('targets = ["v79"]\nchunk_size = 0', "chunk_size", "greater than 1"),
        ('targets = ["v79"]\nchunk_size = 1', "chunk_size", "greater than 1"),
        ('targets = ["v79"]\nchunk_size = -4', "chunk_size", "greater than 1"),
        ('targets = ["v79"]\nchunk_sizes = [128, 1]', "chunk_sizes.1", "greater than 1"),
        ('targets = ["v79"]\nchunk_sizes = []', "chunk_sizes", "at least 1 item"),
        ('targets = ["v79"]\nchunk_sizes = [32, 128, 32]', "chunk_sizes", "lists a length twice ([32, 128, 32])"),
        ('targets = ["v79"]\nchunk_sizes = 128', "chunk_sizes", "valid list"),
        ('targets = ["v79"]\nchunk_size = 64\nchunk_sizes = [128, 32]', "chunk_sizes", "either chunk_size = 64"),
        ("targets = []", "targets", "at least 1 item"),
        ('targets = ["v79"]\nchunk = 12', "chunk", "Extra inputs are not permitted"),
        ('targets = ["v79"]\nsocs = { v79 = "SM8650" }', "socs.v79", "SoC SM8650 is v75, not v79"),
        ('targets = ["v79"]\nverify = { follow_divergence = "yes" }', "verify.follow_divergence", "valid boolean"),
        ('targets = ["v79"]\nverify = { prompt = "" }', "verify.prompt", "neither is empty nor starts or ends with"),
        ('targets = ["v79"]\nverify = { prompt = "hi\\n" }', "verify.prompt", "neither is empty nor starts or ends"),
        ('targets = ["v79"]\nverify = { prompt = 3 }', "verify.prompt", "valid string"),
        # strict types: TOML says what the user wrote; a string or a float is not a length
        ('targets = ["v79"]\nchunk_size = "128"', "chunk_size", "Input should be a valid integer (got '128')"),
        ('targets = ["v79"]\nchunk_size = 128.0', "chunk_size", "Input should be a valid integer (got 128.0)"),
        ('targets = ["v79"]\nchunk_sizes = ["64"]', "chunk_sizes.0", "valid integer (got '64')"),
        ('targets = ["v79"]\nmax_kv_size = "5"', "max_kv_size", "valid integer"),
        ('targets = ["v79"]\nverify = { max_new_tokens = "4" }', "verify.max_new_tokens", "valid integer"),
        ('targets = ["v79"]\nseed = -1', "seed", "greater than or equal to 0 (got -1)"),
        # bounded requests
        ('targets = ["v79"]\nchunk_size = 4097', "chunk_size", "less than or equal to 4096"),
        (
            f'targets = ["v79"]\nchunk_sizes = {list(range(2, 1025))}',
            "chunk_sizes",
            "lists 1023 prefill lengths; at most 12 (each is one more graph in every plugin's binary",
        ),
        (
            'targets = ["v79"]\nchunk_sizes = [256, 64]\nmax_kv_size = 128',
            "chunk_sizes",
            "prefill length 256 is longer than max_kv_size = 128",
        ),
        ('targets = ["v79"]\nchunk_size = 256\nmax_kv_size = 128', "chunk_size", "longer than max_kv_size = 128"),
        # speculative decoding
        ('targets = ["v79"]\nspeculative = "mtp"', "speculative", "Input should be 'eagle', 'lookahead' or 'off'"),
        ('targets = ["v79"]\nspeculative = true', "speculative", "Input should be 'eagle', 'lookahead' or 'off'"),
        ('targets = ["v79"]\ndraft_predict_length = 0', "draft_predict_length", "greater than or equal to 1"),
        ('targets = ["v79"]\ndraft_predict_length = 65', "draft_predict_length", "less than or equal to 64"),
        ('targets = ["v79"]\ndraft_predict_length = "3"', "draft_predict_length", "valid integer"),
        (
            'targets = ["v79"]\nchunk_size = 8\ndraft_predict_length = 8',
            "draft_predict_length",
            "8 + 1 = 9 tokens per verify forward is longer than the longest prefill length 8; expected "
            "draft_predict_length <= 7",
        ),
        (
            'targets = ["v79"]\nspeculative = "off"\ndraft_predict_length = 4',
            "draft_predict_length",
            "is set, but speculative = 'off'",
        ),
        ('targets = ["v79"]\nfamily = "embedding"\nspeculative = "lookahead"', "speculative", "generates no tokens"),
        (
            'targets = ["v79"]\nspeculative = "off"\ndecode_graph = false',
            "decode_graph",
            "is false, but speculative = 'off': a one-token forward then has no graph",
        ),
        ('targets = ["v79"]\ndecode_graph = "no"', "decode_graph", "valid boolean"),
    ],
)
def test_bad_spec_names_file_and_field(tmp_path: Path, body: str, field: str, expected: str) -> None:
    path = write_spec(tmp_path, f'name = "m"\nsource = {{ local = "x" }}\n{body}\n')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert f"field {field!r}" in message
    assert expected in message


def test_the_largest_requests_within_the_bounds_are_accepted(tmp_path: Path) -> None:
    """The bounds refuse only what is over them: 12 lengths up to 4096, within max_kv_size; an image whose encoder
    mask just fits one QNN tensor."""
    twelve = [2**i for i in range(1, 13)]
    spec = load_spec(
        write_spec(tmp_path, f'name = "m"\nsource = {{ local = "x" }}\ntargets = ["v79"]\nchunk_sizes = {twelve}\n')
    )
    assert spec.prefill_lengths[0] == 4096 and len(spec.prefill_lengths) == 12
    kv = 'name = "k"\nsource = { local = "x" }\ntargets = ["v79"]\nchunk_size = 128\nmax_kv_size = 128\n'
    assert load_spec(write_spec(tmp_path, kv, "k.toml")).max_kv_size == 128
    # qwen2.5-vl: 2128 x 2128 px = 23104 patches, mask 2 x 23104^2 floats = 4.27e9 bytes < 2^32
    vl = (
        'name = "v"\nsource = { local = "x" }\ntargets = ["v79"]\nfamily = "vl"\nvisual_encoder = "qwen2.5-vl"\n'
        'image_sizes = ["2128x2128"]\n'
    )
    assert load_spec(write_spec(tmp_path, vl, "v.toml")).image_sizes == ["2128x2128"]


def test_prefill_lengths_longest_first_whatever_the_form(tmp_path: Path) -> None:
    """``chunk_size`` is the one-length form of ``chunk_sizes``; the order written does not change the build."""

    def lengths(body: str) -> tuple[int, ...]:
        return load_spec(
            write_spec(tmp_path, f'name = "m"\nsource = {{ local = "x" }}\ntargets = ["v79"]\n{body}\n')
        ).prefill_lengths

    assert lengths("") == (128,)
    assert lengths("chunk_size = 64") == lengths("chunk_sizes = [64]") == (64,)
    assert lengths("chunk_sizes = [128, 32]") == lengths("chunk_sizes = [32, 128]") == (128, 32)
    assert lengths("chunk_sizes = [16, 256, 64]") == (256, 64, 16)


def test_spec_not_toml(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(path)


def test_duplicate_model_name_across_spec_dirs(tmp_path: Path) -> None:
    write_spec(tmp_path / "a", 'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\n')
    second = write_spec(tmp_path / "b", 'name = "m"\nsource = { local = "y" }\ntargets = ["v75"]\n')
    with pytest.raises(SpecError, match=f"{second}: model name 'm' is already defined by"):
        discover_specs([tmp_path / "a", tmp_path / "b"])


def test_settings_from_environment(tmp_path: Path) -> None:
    env = {
        "MNNBUILD_MODELS_PATH": os.pathsep.join([str(tmp_path / "a"), "rel"]),
        "MNNBUILD_ARTIFACTS": "../out",
    }
    settings = Settings.from_env(tmp_path / "proj", env)
    assert settings.artifact_root == tmp_path / "out"
    assert settings.spec_dirs == (tmp_path / "proj" / "models", tmp_path / "a", tmp_path / "proj" / "rel")
    assert Settings.from_env(tmp_path, {}).artifact_root == tmp_path / "artifacts"
    inside = Settings.from_env(tmp_path / "proj", {"MNNBUILD_ARTIFACTS": "artifacts/ci"})
    assert inside.artifact_root == tmp_path / "proj" / "artifacts" / "ci"
    assert settings.target_root("m", "v79") == tmp_path / "out" / "m" / "v79"


def test_family_defaults_to_text_llm(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, 'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\n'))
    assert spec.family == "llm"
    assert spec.visual_encoder is None and spec.encoder is None and spec.image_sizes == []


def test_vl_spec_image_sizes_and_encoder_shapes(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path,
        'name = "m"\nsource = { local = "x" }\ntargets = ["v79", "v75"]\nfamily = "vl"\n'
        'visual_encoder = "qwen2.5-vl"\nimage_sizes = ["448x448", "896x448", "56x28"]\n',
    )
    spec = load_spec(path)
    assert spec.family == "vl" and spec.encoder is not None
    sizes = spec.parsed_image_sizes()
    assert [str(s) for s in sizes] == ["448x448", "896x448", "56x28"]
    assert (sizes[1].width, sizes[1].height) == (896, 448)
    # 896 wide, 448 high: 64 x 32 patches of 14 px; grid is (height, width).
    assert sizes[1].grid(spec.encoder) == (32, 64)
    assert spec.encoder.input_shapes(sizes[0]) == {
        "patches": [1024, 1176],
        "position_ids": [2, 1024],
        "attention_mask": [2, 1, 1024, 1024],
        "window_index": [256],
    }
    assert spec.encoder.input_shapes(sizes[2])["window_index"] == [2]


def test_qwen3_vl_encoder_shapes(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path,
        'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\nfamily = "vl"\n'
        'visual_encoder = "qwen3-vl"\nimage_sizes = ["448x448", "64x128"]\n',
    )
    spec = load_spec(path)
    assert spec.encoder is not None and spec.encoder.alignment == 32
    first, second = spec.parsed_image_sizes()
    assert spec.encoder.input_shapes(first) == {
        "patches": [784, 1536],
        "position_ids": [2, 784],
        "attention_mask": [1, 784, 784],
        "idx_tensor": [4, 784],
        "weight_tensor": [4, 784],
    }
    assert spec.encoder.input_shapes(second)["patches"] == [32, 1536]


def test_embedding_family(tmp_path: Path) -> None:
    spec = load_spec(
        write_spec(tmp_path, 'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\nfamily = "embedding"\n')
    )
    assert spec.family == "embedding" and spec.encoder is None


VL = 'targets = ["v79"]\nfamily = "vl"\n'


@pytest.mark.parametrize(
    ("body", "field", "expected"),
    [
        ('targets = ["v79"]\nfamily = "vision"', "family", "Input should be 'llm', 'vl' or 'embedding'"),
        (VL + 'image_sizes = ["448x448"]', "visual_encoder", "required for family = 'vl'; expected one of qwen2.5-vl"),
        (VL + 'visual_encoder = "qwen2-vl"\nimage_sizes = ["448x448"]', "visual_encoder", "'qwen2.5-vl' or"),
        (VL + 'visual_encoder = "qwen3-vl"', "image_sizes", "needs at least one '<width>x<height>' size"),
        (VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = []', "image_sizes", "needs at least one"),
        (VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = ["448"]', "image_sizes.0", "is not '<width>x<height>'"),
        (VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = ["448x-32"]', "image_sizes.0", "is not '<width>x<height>'"),
        (VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = [" 64x64"]', "image_sizes.0", "is not '<width>x<height>'"),
        (
            VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = ["64x64", "0x64"]',
            "image_sizes.1",
            "width 0 is not a positive multiple of 32 (one qwen3-vl merged patch: 2 x 16 px) (got '0x64')",
        ),
        (
            VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = ["448x450"]',
            "image_sizes.0",
            "height 450 is not a positive multiple of 32",
        ),
        (
            VL + 'visual_encoder = "qwen2.5-vl"\nimage_sizes = ["448x448", "512x512"]',
            "image_sizes.1",
            "width 512 is not a positive multiple of 28",
        ),
        (
            VL + 'visual_encoder = "qwen2.5-vl"\nimage_sizes = ["896x448", "448x896"]',
            "image_sizes",
            "'448x896' gives the same encoder input shapes as '896x448' (2048 patches); list only one of them",
        ),
        (VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = 448', "image_sizes", "valid list"),
        ('targets = ["v79"]\nimage_sizes = ["448x448"]', "image_sizes", "only a family = 'vl' model has a visual"),
        (
            VL + 'visual_encoder = "qwen2.5-vl"\nimage_sizes = ["99988x99988"]',
            "image_sizes.0",
            "9997600144 pixels is more than the 12845056 MNN's engine resizes a qwen2.5-vl image to at most",
        ),
        (
            VL + 'visual_encoder = "qwen2.5-vl"\nimage_sizes = ["2240x2240"]',
            "image_sizes.0",
            "its encoder input 'attention_mask' would be 5242880000 bytes, more than one QNN tensor holds",
        ),
        (
            VL + 'visual_encoder = "qwen3-vl"\nimage_sizes = ["4096x4096"]',
            "image_sizes.0",
            "'attention_mask' would be 17179869184 bytes",
        ),
        (
            VL + f'visual_encoder = "qwen3-vl"\nimage_sizes = {[f"{32 * i}x32" for i in range(1, 14)]}',
            "image_sizes",
            "lists 13 image sizes; at most 12",
        ),
        (
            'targets = ["v79"]\nfamily = "embedding"\nvisual_encoder = "qwen3-vl"',
            "visual_encoder",
            "only a family = 'vl' model has a visual encoder (family is 'embedding')",
        ),
    ],
)
def test_bad_family_fields_name_file_and_field(tmp_path: Path, body: str, field: str, expected: str) -> None:
    path = write_spec(tmp_path, f'name = "m"\nsource = {{ local = "x" }}\n{body}\n')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: field {field!r}: ")
    assert expected in message


def test_verify_table_reaches_the_verify_task(tmp_path: Path) -> None:
    """``verify = { ... }`` in a spec sets the verify stage's params (so its key): the generation's length and
    whether the bundle's own loop runs on after a tolerated divergence (off unless asked)."""
    asked = load_spec(
        write_spec(
            tmp_path,
            'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\n'
            "verify = { max_new_tokens = 8, follow_divergence = true }\n",
        )
    )
    plain = load_spec(write_spec(tmp_path, 'name = "p"\nsource = { local = "x" }\ntargets = ["v79"]\n', "p.toml"))
    settings = Settings.from_env(tmp_path, {"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts")})
    project = Project(
        settings=settings, specs={"m": asked, "p": plain}, memo=DigestMemo(tmp_path / "memo.json"), chain=CHAIN
    )
    (run,) = stage_runs(project, "verify", asked)
    assert run.params.max_new_tokens == 8 and run.params.follow_divergence is True
    (default,) = stage_runs(project, "verify", plain)
    assert default.params.follow_divergence is False


def test_verify_prompt_reaches_io_and_the_bundle(tmp_path: Path) -> None:
    """``verify = { prompt = ... }`` is what the bundle ships as prompt.txt (verify generates from it, run.sh feeds
    it to the phone) and what io checks fits the prefill length; without it, the bundle's params are as before."""
    body = 'source = { local = "x" }\ntargets = ["v79"]\n'
    asked = load_spec(write_spec(tmp_path, f'name = "m"\n{body}verify = {{ prompt = "Computes the" }}\n'))
    plain = load_spec(write_spec(tmp_path, f'name = "p"\n{body}', "p.toml"))
    settings = Settings.from_env(tmp_path, {"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts")})
    project = Project(
        settings=settings, specs={"m": asked, "p": plain}, memo=DigestMemo(tmp_path / "memo.json"), chain=CHAIN
    )
    for spec in (asked, plain):  # bundle tasks are declared from the partition's plugins: none here
        partition = project.stage_dir("partition", spec)
        partition.mkdir(parents=True)
        (partition / POSTREAT_FILE).write_text('{"merge": {}}', encoding="utf-8")
    (io,) = stage_runs(project, "io", asked)
    (bundle,) = stage_runs(project, "bundle", asked)
    assert io.params.prompt == "Computes the" and bundle.params.prompt == "Computes the\n"
    (io,) = stage_runs(project, "io", plain)
    (bundle,) = stage_runs(project, "bundle", plain)
    assert io.params.prompt == "hello" and bundle.params == BundleParams(soc=plain.soc("v79"))
