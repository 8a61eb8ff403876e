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


@pytest.mark.parametrize("command", DOIT_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("value", ["bogus", ""])
def test_a_log_level_that_is_no_level_is_one_line(run_doit: RunDoit, command: tuple[str, ...], value: str) -> None:
    proc = run_doit(*command, env={"MNNBUILD_LOG_LEVEL": value}, check=False)
    assert proc.returncode != 0
    assert only_line(proc.stdout + proc.stderr) == (
        f"ERROR: MNNBUILD_LOG_LEVEL={value!r}: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case)"
    )


def test_log_levels_in_any_case_are_taken(run_doit: RunDoit) -> None:
    proc = run_doit("list", env={"MNNBUILD_LOG_LEVEL": "warning"})
    assert "io:tiny-qwen3" in proc.stdout


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
