"""A weight file holding only the bytes some readers need, and a model whose offsets point into it.

Once the QNN plugins compute the layers, a partitioned model's CPU ops read a small part of the model's weight file
(`external_ranges`), and MNN's LLM engine reads the tied embeddings (`TieEmbeddings.weight_range`). `plan_weights`
lays out the union of those ranges back to back, in source order, with nothing in between; `relocate_model` and
`TieEmbeddings.moved` point the model and ``llm_config.json`` at the new offsets; `write_weights` copies the bytes.
Every byte a reader gets is the byte it got from the source file.

MNN's engine reads a tied ``weight_offset`` of 0 as "the embeddings are in a separate file", so when the tied
embeddings come first the file starts with `LEAD` zero bytes.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.base.fsutil import temp_path
from mnnbuild.mnn.model import MnnModel, Op
from mnnbuild.mnn.weights import WeightFile, WeightRange, external_tables

LEAD = 64
"""Zero bytes before the first block when an offset that must not be 0 would be (a tied ``weight_offset``)."""
_COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class KeptBlock:
    """Source bytes ``[source_offset, source_offset + size)``, kept at ``offset``."""

    source_offset: int
    offset: int
    size: int


@dataclass(frozen=True)
class WeightPlan:
    """Which bytes of ``source`` the new weight file keeps, and where."""

    source: Path
    source_size: int
    blocks: tuple[KeptBlock, ...]

    @property
    def size(self) -> int:
        return self.blocks[-1].offset + self.blocks[-1].size if self.blocks else 0

    def moved(self, offset: int, size: int = 0) -> int:
        """The new offset of source bytes ``[offset, offset + size)``; MNNFormatError when no block keeps them."""
        i = bisect.bisect_right([b.source_offset for b in self.blocks], offset) - 1
        block = self.blocks[i] if i >= 0 else None
        if block is None or offset + size > block.source_offset + block.size:
            raise MNNFormatError(f"{self.source}: bytes [{offset}, {offset + size}) are not kept in the new file")
        return offset - block.source_offset + block.offset


def plan_weights(
    weight_path: str | os.PathLike[str], ranges: Iterable[WeightRange], *, never_at_zero: Collection[int] = ()
) -> WeightPlan:
    """The union of ``ranges`` of ``weight_path``, back to back in source order (overlapping or touching ranges are
    one block). Each range must lie inside the file (MNNFormatError naming it and its reader otherwise). A source
    offset in ``never_at_zero`` that would land at 0 moves the whole layout by `LEAD` bytes."""
    merged: list[list[int]] = []
    with WeightFile(weight_path) as weights:
        for r in sorted(ranges, key=lambda r: (r.offset, r.size)):
            weights.read(r.offset, r.size, r.reader)  # bounds only
            if r.size == 0:
                continue
            if merged and r.offset <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], r.end)
            else:
                merged.append([r.offset, r.end])
        source_size = weights.size
    at = LEAD if merged and merged[0][0] in set(never_at_zero) else 0
    blocks = []
    for start, end in merged:
        blocks.append(KeptBlock(start, at, end - start))
        at += end - start
    return WeightPlan(Path(weight_path), source_size, tuple(blocks))


def _relocated(main: object, plan: WeightPlan) -> object:
    """A copy of an op's parameters with every external offset moved (`external_tables`)."""
    main = copy.deepcopy(main)
    for table in external_tables(main):
        ext = [int(v) for v in table.external]
        ext[0] = plan.moved(ext[0], sum(ext[1:]))
        table.external = ext
    return main


def relocate_model(model: MnnModel, plan: WeightPlan) -> MnnModel:
    """``model`` reading its external data from the file ``plan`` lays out: the ops that read the weight file get
    copies of their parameters with the new offsets; ``model`` itself is left as it was."""

    def moved(op: Op) -> Op:
        if op.main is None or op.external_path or next(external_tables(op.main), None) is None:
            return op
        return dataclasses.replace(op, main=_relocated(op.main, plan))

    subgraphs = model.subgraphs
    nodes = [n for sub in subgraphs for n in sub.nodes or [] if n.main is not None and not n.externalPath]
    if any(next(external_tables(n.main), None) is not None for n in nodes):
        subgraphs = copy.deepcopy(subgraphs)
        for sub in subgraphs:
            for node in sub.nodes or []:
                if node.main is not None and not node.externalPath:
                    node.main = _relocated(node.main, plan)
    return dataclasses.replace(model, ops=[moved(op) for op in model.ops], subgraphs=subgraphs)


def write_weights(plan: WeightPlan, dest: str | os.PathLike[str]) -> None:
    """Write the file ``plan`` lays out to ``dest`` (through a temp name and a rename)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dest)
    try:
        with open(plan.source, "rb") as fin, open(tmp, "wb") as fout:
            fout.truncate(plan.size)  # the lead, if any, stays zeros
            for block in plan.blocks:
                _copy_range(fin, fout, block)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_range(fin: BinaryIO, fout: BinaryIO, block: KeptBlock) -> None:
    src, dst = fin.fileno(), fout.fileno()
    done = 0
    try:  # in the kernel, without a trip through user space (a reflink where the file system shares blocks)
        while done < block.size:
            n = os.copy_file_range(src, dst, block.size - done, block.source_offset + done, block.offset + done)
            if n <= 0:
                break
            done += n
    except OSError:
        pass  # not supported here (old kernel, other file systems): plain reads and writes below
    while done < block.size:
        data = os.pread(src, min(_COPY_CHUNK, block.size - done), block.source_offset + done)
        if not data:
            raise MNNFormatError(f"{fin.name}: ends inside kept bytes at {block.source_offset + done}")
        os.pwrite(dst, data, block.offset + done)
        done += len(data)
