"""Bad input a user can type (issue 27, inputs and messages): each is one line naming the file or variable and what
was expected, for every doit command, never a traceback."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_MODEL_DIR, RunDoit

DOIT_COMMANDS = (("list",), ("io:tiny-qwen3",), ("clean", "io:tiny-qwen3"), ("info", "io:tiny-qwen3"))


def only_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out, out
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("command", DOIT_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("value", ["bogus", ""])
def test_a_log_level_that_is_no_level_is_one_line(run_doit: RunDoit, command: tuple[str, ...], value: str) -> None:
    proc = run_doit(*command, env={"MNNBUILD_LOG_LEVEL": value}, check=False)
    assert proc.returncode != 0
    assert only_line(proc.stdout + proc.stderr) == (
        f"ERROR: MNNBUILD_LOG_LEVEL={value!r}: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case)"
    )


@pytest.mark.slow
def test_log_levels_in_any_case_are_taken(run_doit: RunDoit) -> None:
    proc = run_doit("list", env={"MNNBUILD_LOG_LEVEL": "warning"})
    assert "io:tiny-qwen3" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("command", DOIT_COMMANDS, ids=lambda c: c[0])
def test_doit_state_that_is_a_directory_is_one_line(run_doit: RunDoit, tmp_path, command: tuple[str, ...]) -> None:
    state = tmp_path / "artifacts" / ".doit.db"
    (state / "kept").mkdir(parents=True)
    proc = run_doit(*command, check=False)
    assert proc.returncode != 0
    assert only_line(proc.stdout + proc.stderr) == (
        f"ERROR: {state}: doit's state file is a directory; expected the sqlite file doit writes there (move it away, "
        "or set MNNBUILD_ARTIFACTS to another artifact root)"
    )
    assert (state / "kept").is_dir(), "a directory mnnbuild did not make is left alone"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("seed = -1", "field 'seed': Input should be greater than or equal to 0 (got -1)"),
        ('chunk_size = "128"', "field 'chunk_size': Input should be a valid integer (got '128')"),
        (f"chunk_sizes = {list(range(2, 1025))}", "field 'chunk_sizes': lists 1023 prefill lengths; at most 12"),
        (
            'family = "vl"\nvisual_encoder = "qwen2.5-vl"\nimage_sizes = ["99988x99988"]',
            "field 'image_sizes.0': 9997600144 pixels is more than the 12845056 MNN's engine resizes a qwen2.5-vl",
        ),
    ],
    ids=["negative-seed", "string-chunk", "1023-lengths", "huge-image"],
)
def test_spec_values_that_used_to_fail_late_are_one_line(run_doit: RunDoit, tmp_path, body: str, expected: str) -> None:
    """Each of these used to get past the spec: a numpy traceback in io (seed), a silent conversion (a string), 4 GB
    of samples in memory (1023 lengths), a 447 GiB allocation (the image)."""
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = specs / "bad.toml"
    spec.write_text(f'name = "bad"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\ntargets = ["v79"]\n{body}\n')
    proc = run_doit("io:bad", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    assert proc.returncode != 0
    line = only_line(proc.stdout + proc.stderr)
    assert line.startswith(f"ERROR: {spec}: {expected}"), line
    assert not (tmp_path / "artifacts" / "bad").exists()


@pytest.mark.slow
def test_a_spec_name_longer_than_a_path_component_takes_is_one_line(run_doit: RunDoit, tmp_path) -> None:
    """Issue 43, item 4: a 300-character name (the pattern allows it) became a path component and a 40-line
    ``OSError: File name too long``; the spec is refused at load, with the limit. 100 characters still build."""
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = specs / "m.toml"
    for name in ("m" * 300, "m" * 101):
        spec.write_text(f'name = "{name}"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\ntargets = ["v79"]\n')
        proc = run_doit(f"fetch:{name}", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
        assert proc.returncode != 0
        line = only_line(proc.stdout + proc.stderr)
        assert line.startswith(f"ERROR: {spec}: field 'name': String should have at most 100 characters"), line
    spec.write_text(f'name = "{"m" * 100}"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\ntargets = ["v79"]\n')
    run_doit(f"fetch:{'m' * 100}", env={"MNNBUILD_MODELS_PATH": str(specs)})


def _model_copy(tmp_path, **llm_config: object):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(TINY_MODEL_DIR, model)
    path = model / "llm_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **llm_config}))
    return model


def _q_proj_external(model) -> list[int]:
    from mnnbuild.mnn import conv_ops, load_model

    op = conv_ops(load_model(model / "llm.mnn"))[0]
    assert op.name == "/layers.0/self_attn/q_proj/Linear"
    return [int(v) for v in op.main.external]


def _set_scale_bytes(model, value: int) -> None:
    from mnnbuild.mnn import conv_ops, load_model, save_model

    graph = load_model(model / "llm.mnn")
    op = conv_ops(graph)[0]
    op.main.external = [*op.main.external[:2], value, *op.main.external[3:]]
    save_model(graph, model / "llm.mnn")


def _nan_scales(model) -> None:
    offset, weight_bytes, scale_bytes = _q_proj_external(model)[:3]
    data = bytearray((model / "llm.mnn.weight").read_bytes())
    data[offset + weight_bytes : offset + weight_bytes + scale_bytes] = b"\xff" * scale_bytes
    (model / "llm.mnn.weight").write_bytes(bytes(data))


Q_PROJ = "op '/layers.0/self_attn/q_proj/Linear'"


@pytest.mark.parametrize(
    ("damage", "file", "expected"),
    [
        (
            lambda m: _set_scale_bytes(m, 3072),
            "llm.mnn",
            f"{Q_PROJ}: Convolution2D external[2] (scale bytes) is 3072: 3 blocks of (zero, scale) pairs per output "
            "channel (128 channels, 4-byte values); expected a whole number of blocks splitting its 128 inputs evenly",
        ),
        (_nan_scales, "llm.mnn.weight", f"{Q_PROJ}: 512 of its 512 scales are not finite (the first at byte 9238"),
        ({"layer_nums": -1}, "llm_config.json", "field 'layer_nums' must be a positive integer, got -1"),
        ({"layer_nums": 3}, "llm_config.json", "field 'layer_nums' is 3, but llm.mnn has 2 layers"),
        ({"is_mrope": "no"}, "llm_config.json", "field 'is_mrope' must be true or false, got 'no'"),
        ({"attn_scale": "x"}, "llm_config.json", "field 'attn_scale' must be a finite number, got 'x'"),
    ],
    ids=["scale-bytes-3072", "nan-scales", "layer-nums-negative", "layer-nums-3", "bool-a-string", "scale-a-string"],
)
def test_a_damaged_model_is_named_where_the_damage_is(tmp_path, damage, file: str, expected: str) -> None:
    """Issue 43, item 5: these stopped io with "output 'hidden_states' has non-finite values" on llm.mnn (no op, and
    for NaN scales not the weight file), or were shipped (layer_nums = -1); fetch names the op or field now."""
    from mnnbuild.base.errors import ModelDirError
    from mnnbuild.model.modeldir import validate_model_dir

    model = _model_copy(tmp_path, **(damage if isinstance(damage, dict) else {}))
    if callable(damage):
        damage(model)
    with pytest.raises(ModelDirError) as info:
        validate_model_dir(model)
    assert str(info.value).startswith(f"{model / file}: {expected}"), str(info.value)


@pytest.mark.slow
def test_nan_scales_stop_doit_at_fetch_naming_the_weight_file(run_doit: RunDoit, tmp_path) -> None:
    model = _model_copy(tmp_path)
    _nan_scales(model)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "m.toml").write_text(f'name = "m"\nsource = {{ local = "{model}" }}\ntargets = ["v79"]\n')
    proc = run_doit("io:m", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    assert proc.returncode == 1
    assert f"ModelDirError: {model / 'llm.mnn.weight'}: {Q_PROJ}: 512 of its 512 scales" in proc.stdout + proc.stderr


def test_a_hidden_size_the_tied_codes_cannot_hold_is_blamed_on_llm_config(tmp_path) -> None:
    """Issue 43, item 5: hidden_size 10^12 in a bundle's llm_config.json was "token ids must be in [0, 0)" on the
    weight file; the runtime's Embeddings and Bundle.open name llm_config.json's field."""
    from mnnbuild_runtime import BundleError, Embeddings

    model = _model_copy(tmp_path, hidden_size=10**12)
    with pytest.raises(BundleError) as info:
        Embeddings(model)
    assert (
        f"{model / 'llm_config.json'}: field 'hidden_size' is 1000000000000, but field 'tie_embeddings' gives 65536 "
        "bytes of 4-bit codes (alpha_offset - weight_offset), no whole number of rows that wide"
    ) in str(info.value)
    assert "token ids" not in str(info.value)


@pytest.mark.slow
def test_a_mistyped_task_gets_the_nearest_name(run_doit: RunDoit) -> None:
    """doit's own answer was `Invalid parameter: "io:tiny-qwen". Must be a command, task, or a target.`"""
    for typed, nearest in (("io:tiny-qwen", "io:tiny-qwen3"), ("bundel:tiny-qwen3-v79", "bundle:tiny-qwen3-v79")):
        proc = run_doit(typed, check=False)
        assert proc.returncode != 0
        assert only_line(proc.stdout + proc.stderr) == (
            f"ERROR: no task {typed!r}; did you mean {nearest!r}? (`doit list` shows every task, `doit list --all` "
            "their subtasks)"
        )


@pytest.mark.slow
def test_every_name_doit_list_shows_passes_the_task_name_check(run_doit: RunDoit) -> None:
    from mnnbuild.dag.project import Project, requested_tasks
    from mnnbuild.dag.tasks import check_task_name
    from tests.conftest import PROJECT_ROOT

    names = [line.split()[0] for line in run_doit("list", "--all").stdout.splitlines() if line.strip()]
    assert "io:tiny-qwen3" in names and "update" in names
    project = Project.load(PROJECT_ROOT)
    for name in [*names, "context:tiny-qwen3-v79:graphllm0", "partition:tiny-qwen3:parts"]:
        check_task_name(project, name)
    # doit's loader and run options in any order are not task names
    assert requested_tasks(["-f", "dodo.py", "-n", "2", "io:x"]) == ("io:x",)
    assert requested_tasks(["run", "-n", "2", "-f", "dodo.py", "io:x"]) == ("io:x",)
