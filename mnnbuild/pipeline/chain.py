"""A chain: a checked list of stage declarations, by name, and the models it is built for (mnnbuild's is
`mnnbuild.stages.chain.CHAIN`).

`Chain` checks the list when it is made: every ``From`` names an earlier stage, a per-part field names a per-part
stage, and no stage reads a stage placed under it (a per-model stage cannot read a per-target one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from mnnbuild.pipeline import layout
from mnnbuild.pipeline.models import Models
from mnnbuild.pipeline.stage import UPDATE_DOC, Stage

_DEPTH = {"model": 0, "part": 0, "target": 1, "plugin": 1}
"""Per-model and per-part stages are built before a target is known; a stage reads only stages at or above it."""


class Chain:
    """A checked list of stages, by name; ``models``: how the DAG finds the models the stages' ``params_of`` read
    (a chain without them declares no tasks, it only names stage dirs)."""

    def __init__(self, stages: Iterable[Stage], models: Models | None = None) -> None:
        self.models = models
        self.stages: dict[str, Stage] = {}
        for stage in stages:
            if stage.name in self.stages:
                raise ValueError(f"stage {stage.name} is listed twice")
            for field, edge in stage.edges.items():
                up = self.stages.get(edge.stage)
                where = f"stage {stage.name}: {stage.inputs.__name__}.{field} reads {edge.stage!r}"
                if up is None:
                    raise ValueError(f"{where}, which is no earlier stage of the chain")
                if edge.part is not None and up.placement != "part":
                    raise ValueError(f"{where} of part {edge.part!r}, but {edge.stage} is not built per part")
                if _DEPTH[up.placement] > _DEPTH[stage.placement]:
                    raise ValueError(f"{where}, which is built per target, from a stage that is not")
            if stage.placement == "plugin" and not any(s.fan_out for s in self.stages.values()):
                raise ValueError(f"stage {stage.name} is built per plugin, after no stage that declares a fan_out")
            if stage.fan_out is not None and any(s.fan_out for s in self.stages.values()):
                raise ValueError(f"stage {stage.name}: a second stage that declares a fan_out")
            if stage.after_failure_of is not None:
                failed = self.stages.get(stage.after_failure_of)
                if failed is None or failed.leaves_on_failure is None:
                    raise ValueError(f"stage {stage.name}: after_failure_of names no earlier stage that leaves a file")
            self.stages[stage.name] = stage

    def __getitem__(self, name: str) -> Stage:
        return self.stages[name]

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages.values())

    def names(self, *placements: str) -> tuple[str, ...]:
        """The stages placed so (all of them when none is given), in chain order."""
        return tuple(s.name for s in self if not placements or s.placement in placements)

    def plugin_dependent(self, name: str) -> bool:
        """Whether a stage's tasks exist only once the partition has said how many plugins there are."""
        stage = self[name]
        return stage.placement == "plugin" or any(self.plugin_dependent(e.stage) for e in stage.edges.values())

    def stage_dir(
        self, artifact_root: Path, name: str, model: str, arch: str | None = None, part: str | None = None
    ) -> Path:
        """`mnnbuild.pipeline.layout.stage_dir` of the stage named ``name``."""
        return layout.stage_dir(artifact_root, self[name], model, arch, part)

    def table(self) -> str:
        """The stage table of the README and docs/design.md (``python -m mnnbuild dag --table``): a row per stage's
        tasks, from its declaration: where its runs sit, the stages it reads, the tools it calls, its `Stage.doc`
        and the upstream tool it mirrors; its module's docstring says the rest."""
        task = {
            "model": "{}:<model>",
            "part": "{}:<model>",
            "target": "{}:<model>-<arch>",
            "plugin": "{}:<model>-<arch>:<plugin>",
        }
        runs = {"model": "model", "part": "model part", "target": "target", "plugin": "plugin of a target"}
        lines = [
            "| task | one run per | reads | calls | what it does (upstream tool) | code |",
            "|---|---|---|---|---|---|",
        ]
        for stage in self:
            read = {e.stage for e in stage.edges.values()}
            reads = ", ".join(f"`{s}`" for s in self.stages if s in read) or "the model's source"
            calls = ", ".join(sorted(stage.tools)) or "—"
            doc = f"{stage.doc.rstrip('.')}; upstream: `{stage.mirrors}`." if stage.mirrors else stage.doc
            code = f"`{stage.entry.__module__.replace('.', '/')}.py`"
            name = task[stage.placement].format(stage.name)
            lines.append(f"| `{name}` | {runs[stage.placement]} | {reads} | {calls} | {doc} | {code} |")
            if stage.update is not None:
                lines.append(f"| `update:<model>` | Hugging Face model | its lock | — | {UPDATE_DOC} | {code} |")
        return "\n".join(lines) + "\n"

    def mermaid(self) -> str:
        """The chain as a Mermaid flowchart: a node per stage (where its runs sit), an edge per stage it reads
        (plain: by its manifest; labelled ``files``: only the files a run lists; dotted: its directory only)."""
        lines = ["flowchart LR"]
        for stage in self:
            lines.append(f'    {stage.name}["{stage.name}<br/>per {stage.placement}"]')
        seen: set[tuple[str, str, str]] = set()
        for stage in self:
            for edge in stage.edges.values():
                if (edge.stage, stage.name, edge.reads) in seen:
                    continue
                seen.add((edge.stage, stage.name, edge.reads))
                arrow = {"manifest": "-->", "files": "-->|files|", "dir": "-.->|dir|"}[edge.reads]
                lines.append(f"    {edge.stage} {arrow} {stage.name}")
        return "\n".join(lines) + "\n"
