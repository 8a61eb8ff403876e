"""The stage declarations: one list of stages, each declaration matching its entry function, its edges the
``From`` annotations of its Inputs; dodo.py, the layout and the DAG derive their stage sets from that list; and a
new stage is one module plus one line in the list."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel

from mnnbuild.dag.project import Project
from mnnbuild.dag.tasks import stage_tasks, task_creators
from mnnbuild.manifests.config import ConfigInputs, ConfigManifest, ConfigParams
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.model.spec import load_spec
from mnnbuild.pipeline.chain import Chain
from mnnbuild.pipeline.fingerprint import DigestMemo
from mnnbuild.pipeline.layout import stage_dir
from mnnbuild.pipeline.settings import Settings
from mnnbuild.pipeline.stage import From, Stage, StageInputs
from mnnbuild.stages.chain import CHAIN, STAGES
from mnnbuild.stages.config import config_params, write_config
from mnnbuild.stages.config import describe as describe_config
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR, executed_tasks, skipped_tasks

DAG_PICTURE = PROJECT_ROOT / "docs" / "dag.md"


def test_every_declaration_matches_its_entry_and_its_inputs() -> None:
    """Each stage's entry is ``(inputs: <Inputs>, params: <Params>, out_dir: Path) -> <Manifest>`` as declared, its
    Params function returns the declared Params, and every Inputs field is an upstream directory (a ``From``), a
    coordinate the DAG fills, or set by the stage's ``fields_of``."""
    for stage in STAGES:
        hints = typing.get_type_hints(stage.entry)
        names = list(inspect.signature(stage.entry).parameters)[:3]
        assert [hints[n] for n in names] == [stage.inputs, stage.params, Path], stage.name
        assert hints["return"] is stage.manifest and stage.manifest.stage == stage.name
        assert typing.get_type_hints(stage.params_of)["return"] is stage.params, stage.name
        for name, edge in stage.edges.items():
            assert edge.stage in CHAIN.names() and edge.stage != stage.name, (stage.name, name)
            assert Path in (
                stage.inputs.model_fields[name].annotation,
                *typing.get_args(stage.inputs.model_fields[name].annotation),
            )
        assert stage.upstream == tuple(dict.fromkeys(e.stage for e in stage.edges.values() if e.reads != "dir"))


class NotADir(StageInputs):
    model: str
    target: str
    model_dir: Annotated[str, From(FetchManifest)]


def _not_a_dir_entry(inputs: NotADir, params: ConfigParams, out_dir: Path) -> ConfigManifest:
    raise AssertionError("never called")


def test_a_declaration_that_does_not_match_its_entry_fails_at_import() -> None:
    def wrong_params(inputs: ConfigInputs, params: BaseModel, out_dir: Path) -> ConfigManifest:
        raise AssertionError("never called")

    def two_args(inputs: ConfigInputs, params: ConfigParams) -> ConfigManifest:
        raise AssertionError("never called")

    common = {"inputs": ConfigInputs, "params": ConfigParams, "manifest": ConfigManifest, "placement": "target"}
    common |= {"params_of": config_params, "describe": describe_config}
    assert Stage(name="config", entry=write_config, **common).upstream == ("fetch",)  # the real one passes
    with pytest.raises(TypeError, match=r"entry .*wrong_params is not \(ConfigInputs, ConfigParams, Path\)"):
        Stage(name="config", entry=wrong_params, **common)
    with pytest.raises(TypeError, match=r"two_args takes \['inputs', 'params'\]"):
        Stage(name="config", entry=two_args, **common)
    with pytest.raises(TypeError, match="'target' on a stage not placed per target"):
        Stage(name="config", entry=write_config, **(common | {"placement": "model"}))

    with pytest.raises(TypeError, match=r"NotADir.model_dir \(From fetch\) must be a Path"):
        Stage(name="config", entry=_not_a_dir_entry, **(common | {"inputs": NotADir}))


def test_a_stage_takes_its_name_and_types_from_its_entry() -> None:
    """Declared once: a Stage that names neither gets its types from its entry's annotations and its name from its
    manifest; an edge names the upstream manifest type; an entry annotated with no model is refused."""
    stage = Stage(entry=write_config, params_of=config_params, describe=describe_config, placement="target")
    assert (stage.name, stage.inputs, stage.params, stage.manifest) == (
        "config",
        ConfigInputs,
        ConfigParams,
        ConfigManifest,
    )
    edge = CHAIN["config"].edges["model_dir"]
    assert edge.upstream is FetchManifest and edge.stage == "fetch"
    assert [s.name for s in CHAIN if s.fan_out is not None] == ["partition"], "one stage declares the plugins"

    def untyped(inputs: object, params: ConfigParams, out_dir: Path) -> ConfigManifest:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"its inputs annotation <class 'object'> is no StageInputs model"):
        Stage(entry=untyped, params_of=config_params, describe=describe_config, placement="target")


def test_a_chain_refuses_an_edge_to_no_earlier_stage() -> None:
    with pytest.raises(ValueError, match="ConfigInputs.model_dir reads 'fetch', which is no earlier stage"):
        Chain([CHAIN["config"], CHAIN["fetch"]])
    with pytest.raises(ValueError, match="listed twice"):
        Chain([CHAIN["fetch"], CHAIN["fetch"]])


def test_dodo_layout_and_dag_derive_their_stage_sets_from_the_one_list(tmp_path: Path) -> None:
    """dodo.py names no stage; its task groups, the layout's per-model / per-target placement and the DAG's plugin
    stages all follow the list (a per-target stage's dir is under its arch, per the declaration)."""
    dodo = (PROJECT_ROOT / "dodo.py").read_text(encoding="utf-8")
    assert not [s.name for s in STAGES if f'"{s.name}"' in dodo or f"task_{s.name}" in dodo]
    tree = ast.parse((PROJECT_ROOT / "mnnbuild" / "pipeline" / "layout.py").read_text(encoding="utf-8"))
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert not names & set(CHAIN.names()) - {"model", "qnn"}, "the layout names stages itself"
    for stage in STAGES:
        where = stage_dir(tmp_path, stage, "m", "v79")
        assert where == tmp_path / "m" / ("v79" if stage.per_target else "") / stage.dir
    settings = Settings.from_env(PROJECT_ROOT, {"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts")})
    project = Project(settings=settings, specs={}, memo=DigestMemo(tmp_path / "memo.json"), chain=CHAIN)
    creators = {name for name in task_creators(project, ["list"]) if name.startswith("task_")}
    assert creators == {f"task_{s.name}" for s in STAGES} | {"task_update"}
    assert CHAIN.names("plugin") == ("context", "twin")
    assert [s.name for s in STAGES if CHAIN.plugin_dependent(s.name)] == [
        "context",
        "twin",
        "bundle",
        "verify",
        "report",
    ]


@pytest.mark.slow
def test_the_dag_picture_is_generated_from_the_stage_list() -> None:
    """docs/dag.md holds `python -m mnnbuild dag`'s picture as it is now: the list changes, the page must too."""
    proc = subprocess.run(
        [sys.executable, "-m", "mnnbuild", "dag"], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout == CHAIN.mermaid()
    for stage in STAGES:
        assert f'{stage.name}["{stage.name}<br/>per {stage.placement}"]' in proc.stdout
        for edge in stage.edges.values():
            assert f" {edge.stage} " in proc.stdout and f" {stage.name}\n" in proc.stdout
    page = DAG_PICTURE.read_text(encoding="utf-8")
    assert f"```mermaid\n{proc.stdout}```" in page, "docs/dag.md is stale: paste `python -m mnnbuild dag` into it"


TOY_STAGE = '''
"""shout: the model's config.json, upper-cased (a stage added in one module)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.base.fsutil import atomic_write_text, staged_dir
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.model.spec import ModelSpec
from mnnbuild.pipeline.manifest import Manifest, record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, From, Stage, StageInputs


class ShoutInputs(StageInputs):
    model: str
    model_dir: Annotated[Path, From(FetchManifest)]


class ShoutParams(BaseModel):
    model_config = ConfigDict(frozen=True)
    times: int


class ShoutManifest(Manifest):
    stage = "shout"
    params: ShoutParams


def shout(inputs: ShoutInputs, params: ShoutParams, out_dir: Path) -> ShoutManifest:
    text = (Path(inputs.model_dir) / "config.json").read_text(encoding="utf-8")
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / "shout.txt", text.upper() * params.times)
        manifest = ShoutManifest(
            model=inputs.model, params=params, tools=tool_versions(), outputs=record_outputs(tmp)
        )
        manifest.write(tmp)
    return manifest


def shout_params(spec: ModelSpec, at: At) -> ShoutParams:
    return ShoutParams(times=2)


def describe(spec: ModelSpec, at: At) -> str:
    return f"shout {spec.name}'s config"


STAGE = Stage(
    name="shout",
    entry=shout,
    inputs=ShoutInputs,
    params=ShoutParams,
    manifest=ShoutManifest,
    params_of=shout_params,
    describe=describe,
    doc="Shout each model's config.",
)
'''

TOY_LIST = """
from mnnbuild.pipeline.chain import Chain
from mnnbuild.model.spec import MODELS
from mnnbuild.stages.chain import STAGES

from toy import shout

CHAIN = Chain((*STAGES, shout.STAGE), models=MODELS)
"""

TOY_DODO = f"""
import sys
from pathlib import Path

from mnnbuild import dag
from toy.chain import CHAIN

dag.configure_logging()
PROJECT = dag.Project.load(Path({str(PROJECT_ROOT)!r}), chain=CHAIN)
DOIT_CONFIG = PROJECT.doit_config()
globals().update(dag.task_creators(PROJECT, sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_new_stage_is_one_module_and_one_line_in_the_list(tmp_path: Path) -> None:
    """A toy stage in a temp package: its module and a list with one more entry. doit lists it, runs it after the
    fetch it reads (its file_dep: the fetch manifest, derived from its ``From``), then finds it up to date."""
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "shout.py").write_text(TOY_STAGE)
    (pkg / "chain.py").write_text(TOY_LIST)
    (tmp_path / "dodo.py").write_text(TOY_DODO)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env |= {"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"), "MNNBUILD_CACHE": "off", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), *([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ else [])]
    )

    def doit(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "doit", "-f", str(tmp_path / "dodo.py"), *args]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 or not check, proc.stdout + proc.stderr
        return proc

    listed = doit("list", "--all").stdout
    assert "shout:tiny-qwen3 " in listed and "shout tiny-qwen3's config" in listed, listed
    info = doit("info", "shout:tiny-qwen3", check=False).stdout  # exit 1: not up to date yet
    fetch_manifest = tmp_path / "artifacts" / "tiny-qwen3" / "model" / "fetch.manifest.json"
    assert str(fetch_manifest) in info, info
    first = doit("shout:tiny-qwen3")
    assert executed_tasks(first.stdout) == ["fetch:tiny-qwen3", "shout:tiny-qwen3"]
    out = tmp_path / "artifacts" / "tiny-qwen3" / "shout" / "shout.txt"
    assert out.read_text() == (TINY_MODEL_DIR / "config.json").read_text().upper() * 2
    second = doit("shout:tiny-qwen3")
    assert executed_tasks(second.stdout) == [] and skipped_tasks(second.stdout) == [
        "fetch:tiny-qwen3",
        "shout:tiny-qwen3",
    ]


def test_a_runs_dirs_and_deps_follow_its_inputs_annotations(tmp_path: Path) -> None:
    """verify is handed every upstream directory its Inputs declare, each placed per model, part or target as the
    upstream stage is; its file_dep are those stages' manifests (one per plugin of context and twin); the page
    report depends on verify.json besides, and on none of the stages whose cost it only shows."""
    spec_file = tmp_path / "m.toml"
    spec_file.write_text(f'name = "m"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\ntargets = ["v79"]\n')
    spec = load_spec(spec_file)
    settings = Settings.from_env(tmp_path, {"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts")})
    project = Project(settings=settings, specs={"m": spec}, memo=DigestMemo(tmp_path / "memo.json"), chain=CHAIN)
    art = tmp_path / "artifacts" / "m"
    (art / "partition").mkdir(parents=True)
    (art / "partition" / "npu_postreat.json").write_text(
        '{"merge": {"qnn/graphllm0.bin": [], "qnn/graphllm1.bin": []}}'
    )
    (run,) = stage_tasks(project, "verify", spec)
    deps = set(run["file_dep"])
    expected = {
        art / "v79" / "bundle" / "bundle.manifest.json",
        art / "partition" / "partition.manifest.json",
        art / "io" / "io.manifest.json",
        art / "model" / "fetch.manifest.json",
        *(art / "v79" / s / f"graphllm{k}" / f"{s}.manifest.json" for s in ("context", "twin") for k in (0, 1)),
    }
    assert deps == {str(p) for p in expected}
    inputs = run["actions"][0][1][1]
    assert inputs.context_dir == art / "v79" / "context" and inputs.visual_io_dir is None
    (page,) = stage_tasks(project, "report", spec)
    assert set(page["file_dep"]) == {
        str(art / "v79" / "verify" / "verify.json"),
        str(art / "v79" / "verify" / "verify.manifest.json"),
        str(art / "partition" / "partition.manifest.json"),
        str(art / "v79" / "bundle" / "bundle.manifest.json"),
    }
